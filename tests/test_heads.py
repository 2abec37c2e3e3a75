from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embedx.errors import InvalidModel
from embedx.models.heads import ScoringModel
from embedx.models.packing import pack, to_device
from embedx.models.pairs import pair_max_length, reads_token_types
from embedx.models.source import ModelFiles, resolve
from embedx.models.task import activate, task_of
from tests.support.pairs import encode_pairs

CPU = torch.device("cpu")


def scoring(files: ModelFiles, implementation: str = "auto") -> ScoringModel:
    """The model's scoring replica on the CPU in float32, its task and token types read as the
    engine reads them, once."""
    task = task_of(files.config, files.directory)
    types = reads_token_types(files.config, files.directory) if task.kind == "score" else False
    return ScoringModel(files, CPU, "float32", implementation, task=task, token_types=types)


def some_pairs(texts: list[str]) -> list[tuple[str, str]]:
    long = " ".join(texts[:60])
    pairs = [(texts[i], texts[i + 1]) for i in range(0, 24, 2)]
    return [*pairs, (long, texts[1]), (texts[2], long), (long, " ".join(texts[60:140])),
            (long, long), ("", "")]  # fmt: skip


def embedx_logits(model: ScoringModel, directory: Path, pairs: list[tuple[str, str]]) -> Any:
    from tokenizers import Tokenizer

    files = resolve(str(directory))
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    max_len = pair_max_length(files.config, directory)
    assert max_len is not None
    encoded = encode_pairs(tokenizer, pairs, max_len, types=model.reads_token_types)
    return model.forward(to_device(pack(encoded.views()), CPU)).numpy()


def transformers_logits(directory: Path, pairs: list[tuple[str, str]]) -> Any:
    """AutoModelForSequenceClassification on the pairs as its tokenizer pads and truncates them."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    inputs = tokenizer([q for q, _ in pairs], [d for _, d in pairs], padding=True,
                       truncation="longest_first", return_tensors="pt")  # fmt: skip
    with torch.inference_mode():
        return model(**inputs).logits.numpy()


@pytest.mark.parametrize("implementation", ["native", "transformers"])
@pytest.mark.parametrize("name", ["bert-1", "bert-3", "xlm-roberta-1", "xlm-roberta-3"])
def test_scores_equal_cross_encoder_and_transformers(
    tiny_classifiers: dict[str, Path], reference_texts: list[str], name: str, implementation: str
) -> None:
    from sentence_transformers import CrossEncoder

    directory = tiny_classifiers[name]
    pairs = some_pairs(reference_texts)
    model = scoring(resolve(str(directory)), implementation)
    assert model.implementation == ("bert" if implementation == "native" else implementation)
    logits = embedx_logits(model, directory, pairs)
    labels = len(model.labels)
    assert logits.shape == (len(pairs), labels)
    assert logits.dtype == np.float32

    cross_encoder = CrossEncoder(str(directory), device="cpu")
    raw = cross_encoder.predict(pairs, activation_fn=torch.nn.Identity()).reshape(-1, labels)
    np.testing.assert_allclose(logits, raw, atol=1e-5, rtol=0)
    np.testing.assert_allclose(logits, transformers_logits(directory, pairs), atol=1e-5, rtol=0)
    # sigmoid for a reranker, softmax over a classifier's labels
    expected = cross_encoder.predict(pairs, apply_softmax=labels > 1).reshape(-1, labels)
    scores = activate(logits, model.task.activation)
    np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=0)
    assert scores.std(axis=0).max() > 1e-3  # the pairs are told apart


def test_a_bert_pairs_document_is_read_as_type_1(tiny_classifiers: dict[str, Path]) -> None:
    """Were the types dropped, the scores would differ: the equality with CrossEncoder above
    holds because each token's type reaches the embeddings."""
    directory = tiny_classifiers["bert-1"]
    model = scoring(resolve(str(directory)), "native")
    assert model.reads_token_types
    pair = [("a cat", "sits on the mat")]
    as_pair = embedx_logits(model, directory, pair)
    model.reads_token_types = False  # bare ids, every token type 0
    model.scorer.encoder.types = None  # type: ignore[attr-defined]
    assert abs(float(as_pair[0, 0] - embedx_logits(model, directory, pair)[0, 0])) > 1e-3


def test_an_embedding_model_cannot_score(tiny_models: dict[str, Path]) -> None:
    with pytest.raises(InvalidModel, match="not a sequence-classification model"):
        scoring(resolve(str(tiny_models["bert-base"])))


@pytest.mark.parametrize("implementation", ["native", "transformers"])
@pytest.mark.parametrize(
    ("name", "dropped"), [("bert-1", "classifier.weight"), ("bert-3", "bert.pooler.dense.bias"),
                          ("xlm-roberta-1", "classifier.out_proj.bias")]
)  # fmt: skip
def test_a_checkpoint_without_its_head_is_refused(
    tiny_classifiers: dict[str, Path], tmp_path: Path, name: str, dropped: str, implementation: str
) -> None:
    from safetensors.torch import load_file, save_file

    directory = tmp_path / name
    shutil.copytree(tiny_classifiers[name], directory)
    tensors = load_file(str(directory / "model.safetensors"))
    del tensors[dropped]
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InvalidModel, match=dropped.rsplit(".", 1)[0]):
        scoring(resolve(str(directory)), implementation)


def test_a_head_of_the_wrong_number_of_labels_is_refused(
    tiny_classifiers: dict[str, Path], tmp_path: Path
) -> None:
    directory = tmp_path / "bert"
    shutil.copytree(tiny_classifiers["bert-3"], directory)
    config = json.loads((directory / "config.json").read_text())
    config["id2label"] = {"0": "only"}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidModel, match=r"classifier.weight.*expected \(1, 64\)"):
        scoring(resolve(str(directory)), "native")


def test_native_code_without_a_head_for_the_model_type_refuses_and_auto_takes_transformers(
    tiny_classifiers: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedx.models import heads

    monkeypatch.delitem(heads.HEADS, "xlm-roberta")
    files = resolve(str(tiny_classifiers["xlm-roberta-1"]))
    with pytest.raises(InvalidModel, match="no sequence-classification head"):
        scoring(files, "native")
    assert scoring(files, "auto").implementation == "transformers"
