"""Reranker: score (query, document) pairs and rank documents from scripts and notebooks, shaped
like sentence-transformers' CrossEncoder (`predict`, `rank`), over one Engine on its own loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from embedx.engine import ScoreOptions
from embedx.errors import InvalidOption
from embedx.library import LocalModel, check_flag, check_unicode


class Reranker(LocalModel):
    """A cross-encoder (a reranker or a classifier) on every device it fits, from plain code.

        with Reranker("BAAI/bge-reranker-v2-m3") as r:
            hits = r.rank("what is a cat?", documents, top_k=3)
            scores = r.predict([("what is a cat?", "a small furry animal")])

    Scores are the model's, as sentence-transformers' CrossEncoder gives them: the sigmoid
    of a reranker's one logit; a classifier's softmax over its labels (`raw=True`: logits).
    """

    task = "score"

    @property
    def labels(self) -> tuple[str, ...]:
        """A classifier's labels, in the order of its scores' columns."""
        return self._engine.task.labels

    def predict(
        self,
        pairs: Sequence[tuple[str, str]] | tuple[str, str],
        *,
        raw: bool = False,
        truncate: bool = True,
        instruction: str | None = None,
    ) -> np.ndarray:
        """The scores of (query, document) pairs, in order: (N,) for a model of one label,
        (N, labels) for a classifier; a single pair gives a single row. `instruction`: a
        causal-LM reranker's (Qwen3-Reranker's) task, its chat template's system message, as
        CrossEncoder's `prompt`; None: the model's default."""
        return self._call(self._predict(pairs, raw, truncate, instruction))

    async def apredict(
        self,
        pairs: Sequence[tuple[str, str]] | tuple[str, str],
        *,
        raw: bool = False,
        truncate: bool = True,
        instruction: str | None = None,
    ) -> np.ndarray:
        """`predict` for async code."""
        return await self._await(self._predict(pairs, raw, truncate, instruction))

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        return_documents: bool = False,
        truncate: bool = True,
        instruction: str | None = None,
    ) -> list[dict[str, Any]]:
        """`documents` by their score against `query`, best first, as CrossEncoder.rank gives
        them: `{"corpus_id": index, "score": score}` (and `"text"` with return_documents),
        the first `top_k` only where it is given; `instruction` as `predict` takes it."""
        ranked = self._rank(query, documents, top_k, return_documents, truncate, instruction)
        return self._call(ranked)

    async def arank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        return_documents: bool = False,
        truncate: bool = True,
        instruction: str | None = None,
    ) -> list[dict[str, Any]]:
        """`rank` for async code."""
        ranked = self._rank(query, documents, top_k, return_documents, truncate, instruction)
        return await self._await(ranked)

    async def _predict(
        self,
        pairs: Sequence[tuple[str, str]] | tuple[str, str],
        raw: bool,
        truncate: bool,
        instruction: str | None = None,
    ) -> np.ndarray:
        single = _is_pair(pairs)
        batch: Any = [pairs] if single else pairs
        check_flag("raw", raw)
        check_flag("truncate", truncate)
        if isinstance(batch, Sequence) and all(_is_pair(pair) for pair in batch):
            check_unicode([side for pair in batch for side in pair])
        options = ScoreOptions(truncate, raw, instruction)
        scores = (await self._engine.score(batch, options)).scores
        if scores.shape[1] == 1:
            scores = scores[:, 0]
        return scores[0] if single else scores

    async def _rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None,
        return_documents: bool,
        truncate: bool,
        instruction: str | None,
    ) -> list[dict[str, Any]]:
        if len(self.labels) != 1:
            raise InvalidOption(
                f"rank() scores documents with a model of one label; this one has "
                f"{len(self.labels)} ({', '.join(self.labels)}): use predict()",
                param="model",
            )
        if top_k is not None and (type(top_k) is not int or top_k < 1):
            raise InvalidOption(
                f"top_k must be a whole number from 1, got {top_k!r}", param="top_k"
            )
        if isinstance(documents, str) or not isinstance(documents, Sequence):
            raise InvalidOption("documents must be a list of strings", param="documents")
        pairs = [(query, doc) for doc in documents]
        scores = await self._predict(pairs, False, truncate, instruction)
        order = np.argsort(-scores, kind="stable")[:top_k]
        return [
            {"corpus_id": int(i), "score": float(scores[i]),
             **({"text": documents[i]} if return_documents else {})}
            for i in order
        ]  # fmt: skip


def _is_pair(value: object) -> bool:
    return (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(side, str) for side in value)
    )
