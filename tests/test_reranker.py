"""The library's Reranker: CrossEncoder's `predict` and `rank`, and their async twins."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from embedx import Reranker
from embedx.errors import InvalidOption, WrongModelTask


def cross_encoder(directory: Path) -> object:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(directory), device="cpu")


def test_predict_and_rank_are_cross_encoders(
    tiny_classifiers: dict[str, Path], reference_texts: list[str]
) -> None:
    directory = tiny_classifiers["bert-1"]
    reference = cross_encoder(directory)
    query, documents = reference_texts[0], reference_texts[1:40]
    pairs = [(query, doc) for doc in documents]
    with Reranker(str(directory), devices="cpu") as reranker:
        assert reranker.labels == ("relevance",)
        scores = reranker.predict(pairs)
        one = reranker.predict(pairs[3])
        ranked = reranker.rank(query, documents, top_k=5, return_documents=True)
        every = asyncio.run(reranker.arank(query, documents))
        raw = asyncio.run(reranker.apredict(pairs, raw=True))
    expected = reference.predict(pairs)  # type: ignore[attr-defined]
    assert scores.shape == (len(pairs),)
    np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=0)
    assert one == pytest.approx(float(expected[3]), abs=1e-5)
    np.testing.assert_allclose(1 / (1 + np.exp(-raw)), expected, atol=1e-5, rtol=0)
    theirs = reference.rank(query, documents, top_k=5, return_documents=True)  # type: ignore[attr-defined]
    assert [hit["corpus_id"] for hit in ranked] == [hit["corpus_id"] for hit in theirs]
    assert [hit["text"] for hit in ranked] == [hit["text"] for hit in theirs]
    assert [hit["score"] for hit in ranked] == pytest.approx([h["score"] for h in theirs], abs=1e-5)
    assert [hit["corpus_id"] for hit in every] == list(np.argsort(-scores, kind="stable"))
    assert "text" not in every[0]


def test_a_classifier_predicts_a_score_per_label_and_does_not_rank(
    tiny_classifiers: dict[str, Path], reference_texts: list[str]
) -> None:
    directory = tiny_classifiers["xlm-roberta-3"]
    pairs = [(reference_texts[i], reference_texts[i + 1]) for i in range(10)]
    expected = cross_encoder(directory).predict(pairs, apply_softmax=True)  # type: ignore[attr-defined]
    with Reranker(str(directory), devices="cpu") as classifier:
        assert classifier.labels == ("contradiction", "entailment", "neutral")
        scores = classifier.predict(pairs)
        with pytest.raises(InvalidOption, match="use predict"):
            classifier.rank("q", ["d"])
    np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=1e-6)


def test_an_embedding_model_is_no_reranker(minilm_dir: Path) -> None:
    reranker = Reranker(str(minilm_dir), pooling="mean", devices="cpu")
    with reranker, pytest.raises(WrongModelTask, match="embeds texts"):
        reranker.predict([("a", "b")])
