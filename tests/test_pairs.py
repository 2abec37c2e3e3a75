from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embedx.errors import InvalidModel
from embedx.models.pairs import TYPE_SHIFT, pair_max_length, reads_token_types, split_types
from tests.support.pairs import encode_pairs


def tokenizer_of(directory: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(directory / "tokenizer.json"))


def config_of(directory: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((directory / "config.json").read_text())
    return config


def cross_encoder_ids(
    directory: Path, pairs: list[tuple[str, str]]
) -> list[tuple[list[int], list[int]]]:
    """The (ids, token types) sentence-transformers' CrossEncoder gives the model for each pair."""
    from sentence_transformers import CrossEncoder

    features = CrossEncoder(str(directory), device="cpu").preprocess(pairs)
    mask = features["attention_mask"].bool()
    types = features.get("token_type_ids", torch.zeros_like(features["input_ids"]))
    return [
        (ids[keep].tolist(), kinds[keep].tolist())
        for ids, kinds, keep in zip(features["input_ids"], types, mask, strict=True)
    ]


def long_pairs(texts: list[str]) -> list[tuple[str, str]]:
    long = " ".join(texts[:60])
    return [
        (long, texts[1]),  # the query over-long
        (texts[2], long),  # the document
        (long, " ".join(texts[60:140])),  # both, the document longer
        (" ".join(texts[60:140]), long),  # both, the query longer
        (long, long),  # both, equal
        (texts[3], texts[4]),  # neither
        ("", ""),
    ]


@pytest.mark.parametrize("model", ["bert-1", "xlm-roberta-1"])
def test_pairs_are_tokenized_and_truncated_exactly_as_cross_encoder_does(
    tiny_classifiers: dict[str, Path], reference_texts: list[str], model: str
) -> None:
    directory = tiny_classifiers[model]
    pairs = long_pairs(reference_texts)
    max_len = pair_max_length(config_of(directory), directory)
    assert max_len == 512
    types = reads_token_types(config_of(directory), directory)
    encoded = encode_pairs(tokenizer_of(directory), pairs, max_len, types=types)
    got = []
    for row in encoded.views():
        ids, kinds = split_types(torch.from_numpy(row))
        got.append((ids.tolist(), kinds.tolist()))
    assert got == cross_encoder_ids(directory, pairs)
    assert encoded.truncated == [0, 1, 2, 3, 4]
    assert all(encoded.lengths[i] == 512 for i in encoded.truncated)


def test_token_types_ride_in_the_ids_high_bits_and_come_back_on_the_device(
    tiny_classifiers: dict[str, Path],
) -> None:
    tokenizer = tokenizer_of(tiny_classifiers["bert-1"])
    pairs = [("what is a cat", "a small furry animal"), ("q", "d")]
    encoded = encode_pairs(tokenizer, pairs, 512, types=True)
    encodings = tokenizer.encode_batch(pairs)  # as encode_pairs set it: no padding
    for row, encoding in zip(encoded.views(), encodings, strict=True):
        assert row.dtype == np.int32
        assert (row >> TYPE_SHIFT).tolist() == encoding.type_ids
        ids, types = split_types(torch.from_numpy(row))
        assert ids.tolist() == encoding.ids
        assert types.tolist() == encoding.type_ids
        assert 1 in encoding.type_ids  # the document's
    bare = encode_pairs(tokenizer, pairs, 512, types=False)
    assert [row.tolist() for row in bare.views()] == [e.ids for e in encodings]


def test_each_side_is_cut_before_tokenizing_and_a_long_enough_cut_keeps_the_same_ids(
    tiny_classifiers: dict[str, Path], reference_texts: list[str]
) -> None:
    tokenizer = tokenizer_of(tiny_classifiers["bert-1"])
    document = " ".join(reference_texts) * 4  # hundreds of thousands of characters
    pairs = [("a short query", document), (document, document)]
    seen: list[int] = []

    def cut(text: str) -> str:
        seen.append(len(text))
        return text[:8000]  # more than 128 tokens of these texts

    whole = encode_pairs(tokenizer, pairs, 128, types=True)
    cut_first = encode_pairs(tokenizer, pairs, 128, types=True, cut=cut)
    assert sorted(seen) == [len("a short query"), len(document)]  # each distinct text once
    assert [r.tolist() for r in cut_first.views()] == [r.tolist() for r in whole.views()]
    assert cut_first.truncated == whole.truncated == [0, 1]


def test_a_bert_tokenizer_gives_token_types_and_an_xlm_r_one_does_not(
    tiny_classifiers: dict[str, Path],
) -> None:
    from transformers import AutoTokenizer

    for model, expected in (("bert-1", True), ("xlm-roberta-3", False)):
        directory = tiny_classifiers[model]
        assert reads_token_types(config_of(directory), directory) is expected
        names = AutoTokenizer.from_pretrained(str(directory)).model_input_names
        assert ("token_type_ids" in names) is expected


def test_a_tokenizer_config_that_names_the_models_inputs_decides(
    tiny_classifiers: dict[str, Path], tmp_path: Path
) -> None:
    directory = tmp_path / "bert"
    shutil.copytree(tiny_classifiers["bert-1"], directory)
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    settings["model_input_names"] = ["input_ids", "attention_mask"]
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    assert not reads_token_types(config_of(directory), directory)
    assert cross_encoder_ids(directory, [("a", "b")]) == [([101, 1037, 102, 1038, 102], [0] * 5)]


def test_a_model_whose_ids_leave_no_room_for_types_is_refused(
    tiny_classifiers: dict[str, Path],
) -> None:
    directory = tiny_classifiers["bert-1"]
    config = {**config_of(directory), "vocab_size": (1 << TYPE_SHIFT) + 1}
    with pytest.raises(InvalidModel, match="token types"):
        reads_token_types(config, directory)


def test_pairs_are_cut_to_the_length_cross_encoder_reads(
    tiny_classifiers: dict[str, Path], tmp_path: Path
) -> None:
    from sentence_transformers import CrossEncoder

    directory = tmp_path / "plain"
    shutil.copytree(tiny_classifiers["bert-1"], directory)
    settings_path = directory / "tokenizer_config.json"
    settings = json.loads(settings_path.read_text())
    cases = [(settings | {"model_max_length": 200}, 200),  # the tokenizer's
             (settings | {"model_max_length": 4096}, 512),  # capped at the position table
             ({k: v for k, v in settings.items() if k != "model_max_length"}, 512)]  # fmt: skip
    for tokenizer_settings, length in cases:
        settings_path.write_text(json.dumps(tokenizer_settings))
        assert pair_max_length(config_of(directory), directory) == length
        assert CrossEncoder(str(directory), device="cpu").max_seq_length == length
    saved = tmp_path / "saved"  # a saved CrossEncoder's own length, uncapped
    CrossEncoder(str(directory), max_length=100).save_pretrained(str(saved))
    assert pair_max_length(config_of(saved), saved) == 100
    assert CrossEncoder(str(saved), device="cpu").max_seq_length == 100
