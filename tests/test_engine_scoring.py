"""The engine scores (query, document) pairs on the same converging queue as it embeds texts:
equal to sentence-transformers' CrossEncoder on one device and split over several."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embedx.engine import EmbedOptions, ScoreOptions
from embedx.errors import InputTooLong, InvalidInput, WrongModelTask
from tests.support.fakes import SlowForward

pytestmark = pytest.mark.anyio


def some_pairs(texts: list[str]) -> list[tuple[str, str]]:
    """Short pairs of every length, and pairs whose query, document or both are over-long."""
    long = " ".join(texts[:60])
    pairs = [(texts[i], texts[i + 1]) for i in range(0, 80, 2)]
    return [*pairs, (long, texts[1]), (texts[2], long), (long, " ".join(texts[60:140])),
            (long, long), ("", "")]  # fmt: skip


def cross_encoder(directory: Path) -> Any:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(directory), device="cpu")


@pytest.mark.parametrize("name", ["bert-1", "bert-3", "xlm-roberta-1", "xlm-roberta-3"])
async def test_scores_equal_cross_encoder_on_one_device(
    make_engine: Callable[..., Any],
    tiny_classifiers: dict[str, Path],
    reference_texts: list[str],
    name: str,
) -> None:
    directory = tiny_classifiers[name]
    pairs = some_pairs(reference_texts)
    reference = cross_encoder(directory)
    labels = int(name[-1])
    expected = reference.predict(pairs, apply_softmax=labels > 1).reshape(-1, labels)
    logits = reference.predict(pairs, activation_fn=torch.nn.Identity()).reshape(-1, labels)
    async with make_engine(model_dir=directory, max_seq_len=None) as engine:
        assert engine.task.kind == "score"
        assert engine.pooling is None
        scored = await engine.score(pairs)
        raw = await engine.score(pairs, ScoreOptions(raw=True))
    assert scored.scores.shape == (len(pairs), labels)
    np.testing.assert_allclose(scored.scores, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(raw.scores, logits, atol=1e-5, rtol=0)
    assert scored.truncated == 4  # the over-long pairs: cut as CrossEncoder cuts them
    assert scored.tokens > 0


async def test_pairs_split_over_devices_of_different_speed_score_the_same(
    make_engine: Callable[..., Any], tiny_classifiers: dict[str, Path], reference_texts: list[str]
) -> None:
    directory = tiny_classifiers["bert-1"]
    pairs = some_pairs(reference_texts) * 4
    expected = cross_encoder(directory).predict(pairs).reshape(-1, 1)
    async with make_engine(
        ("fast", "slow"), model_dir=directory, max_seq_len=None, max_batch_tokens=1024
    ) as engine:
        slow = SlowForward(engine.replicas[1].model.forward, rate=20_000)
        engine.replicas[1].model.forward = slow
        scored = await engine.score(pairs)
    np.testing.assert_allclose(scored.scores, expected, atol=1e-5, rtol=0)
    assert slow.calls > 0  # both devices took part


async def test_requests_for_pairs_and_their_options_are_checked(
    make_engine: Callable[..., Any], tiny_classifiers: dict[str, Path], reference_texts: list[str]
) -> None:
    long = " ".join(reference_texts[:60])
    async with make_engine(model_dir=tiny_classifiers["bert-1"], max_seq_len=64) as engine:
        with pytest.raises(InputTooLong, match="input 1"):
            await engine.score([("a", "b"), ("q", long)], ScoreOptions(truncate=False))
        with pytest.raises(InvalidInput, match="input 0 is neither"):
            await engine.score([("only one side",)])
        with pytest.raises(WrongModelTask, match="scores \\(query, document\\) pairs") as refused:
            await engine.embed(["a text"], EmbedOptions())
        assert refused.value.task == "score"
        assert refused.value.status == 400
        assert engine.report().as_dict()["labels"] == ["relevance"]


async def test_an_embedding_model_does_not_score_pairs(make_engine: Callable[..., Any]) -> None:
    async with make_engine() as engine:
        with pytest.raises(WrongModelTask, match="embeds texts") as refused:
            await engine.score([("a query", "a document")])
    assert refused.value.task == "embed"


async def test_a_classifier_scores_single_texts_as_transformers_classifies_them(
    make_engine: Callable[..., Any], tiny_classifiers: dict[str, Path], reference_texts: list[str]
) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    directory = tiny_classifiers["bert-3"]
    texts = reference_texts[:20]
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    with torch.inference_mode():
        inputs = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        expected = torch.softmax(model(**inputs).logits, dim=1).numpy()
    async with make_engine(model_dir=directory, max_seq_len=None) as engine:
        mixed = await engine.score([texts[0], (texts[1], texts[2]), *texts[1:]])
    np.testing.assert_allclose(mixed.scores[[0, *range(2, 21)]], expected, atol=1e-5, rtol=0)
