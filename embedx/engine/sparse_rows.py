"""Rows beyond one dense vector a text: sparse rows (SPLADE's vocabulary-wide ones, BGE-M3's token
weights merged by id) and ColBERT token vectors. What a request asks of them is settled once; a
batch's flat block from the device is read back into each request's rows on the host; the rows
are finished (top-k, normalized) once the request is whole.

A batch's block holds the outputs its requests want, in `OUTPUTS`' order, each flattened:
dense (B, D) rows; sparse rows (SPLADE's, cut on the device to each row's non-zeros:
engine/compact_rows.py) or (T,) token weights (BGE-M3: one float a token, merged by id here);
colbert (T, C) token vectors, a text's first token's among them (BGE-M3 gives none for it).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from embedx.errors import InvalidOption, WrongModelTask

if TYPE_CHECKING:
    from embedx.engine.compact_rows import VocabRows
    from embedx.engine.outputs import OutputSpec
    from embedx.models.task import ModelTask
    from embedx.scheduling import Item

OUTPUTS = ("dense", "sparse", "colbert")
DENSE = ("dense",)


@dataclass(frozen=True, slots=True)
class SparseRow:
    """A text's sparse row: the token ids that weigh (ascending) and their weights (above 0)."""

    indices: np.ndarray  # (K,) int64
    values: np.ndarray  # (K,) float32


@dataclass(frozen=True, slots=True)
class MultiSpec:
    """What a request asks beyond dense rows, settled against its model."""

    outputs: tuple[str, ...]  # in OUTPUTS' order
    top_k: int | None  # a sparse row keeps its k largest weights
    vocab_rows: bool  # sparse rows come vocabulary-wide (SPLADE), else as token weights
    unweighted: tuple[int, ...]  # token ids a row of token weights leaves out


def settle_outputs(
    task: ModelTask, name: str, outputs: Sequence[str], top_k: int | None
) -> MultiSpec | None:
    """A request's outputs checked against its model's: None for dense rows alone (the dense
    path); WrongModelTask where the model gives none of some."""
    given: object = outputs  # the library's callers: anything
    if isinstance(given, str) or not isinstance(given, Sequence) or not given:
        raise InvalidOption(
            f"outputs must be a non-empty list of {', '.join(OUTPUTS)}, got {outputs!r}",
            param="outputs",
        )
    unknown = [o for o in outputs if o not in OUTPUTS]
    if unknown:
        raise InvalidOption(
            f"unknown output {unknown[0]!r}: the outputs are {', '.join(OUTPUTS)}",
            param="outputs",
        )
    wanted = tuple(o for o in OUTPUTS if o in outputs)
    if top_k is not None:
        value: object = top_k
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or top_k < 1:
            raise InvalidOption(f"top_k must be a whole number, 1 or more, got {top_k!r}",
                                param="top_k")  # fmt: skip
        if "sparse" not in wanted:
            raise InvalidOption("top_k prunes sparse rows: ask for them", param="top_k")
    missing = [o for o in wanted if o not in task.outputs]
    if missing:
        gives = " and ".join(task.outputs)
        raise WrongModelTask(
            f"model {name!r} gives {gives} rows; it has no {missing[0]} ones",
            task="sparse" if task.kind == "sparse" else "embed",
        )
    if wanted == DENSE:
        return None
    return MultiSpec(wanted, top_k, task.splade is not None, task.unweighted)


class Block:
    """A finished batch's flat block, cut into its outputs: views of the device's buffer, valid
    until its next launch. SPLADE's rows are read through `vocab` (its whole block)."""

    __slots__ = ("colbert", "cu", "dense", "ids", "sparse", "vocab")

    def __init__(
        self, items: Sequence[Item], block: np.ndarray, outputs: tuple[str, ...],
        width: int, vocab: VocabRows | None,
    ) -> None:  # fmt: skip
        count = len(items)
        lengths = np.fromiter((item.length for item in items), np.intp, count)
        self.cu = np.concatenate(([0], np.cumsum(lengths)))  # text b is tokens cu[b]:cu[b + 1]
        self.ids = [item.ids for item in items]
        tokens = int(self.cu[-1])
        flat = block.reshape(-1)
        self.dense = self.sparse = self.colbert = flat[:0]
        start = 0
        if "dense" in outputs:
            self.dense = flat[: count * width].reshape(count, width)
            start = count * width
        self.vocab = vocab
        if "sparse" in outputs and vocab is None:
            self.sparse = flat[start : start + tokens]
            start += tokens
        if "colbert" in outputs:
            self.colbert = flat[start:].reshape(tokens, -1)


class MultiRows:
    """A request's rows when it asks beyond dense ones: each output's, in its order."""

    __slots__ = ("array", "colbert", "multi", "sparse", "spec")

    def __init__(self, spec: OutputSpec, multi: MultiSpec, count: int) -> None:
        self.spec = spec
        self.multi = multi
        self.array = np.empty((count, spec.width if "dense" in multi.outputs else 0), np.float32)
        self.sparse: list[SparseRow] = []
        self.colbert: list[np.ndarray] = []
        if "sparse" in multi.outputs:
            self.sparse = [_EMPTY] * count
        if "colbert" in multi.outputs:
            self.colbert = [_NO_VECTORS] * count

    def write(self, indices: np.ndarray, rows: np.ndarray, form: object) -> None:
        """Never called: such a request's batches come as blocks (`write_block`)."""
        raise AssertionError("a request of several outputs was given dense rows: this is a bug")

    def write_block(self, block: Block, indices: np.ndarray, picked: np.ndarray) -> None:
        """Copy this request's texts' rows (`picked` in the batch, `indices` in the request)
        out of a batch's block."""
        outputs = self.multi.outputs
        if "dense" in outputs:
            self.array[indices] = block.dense[picked]
        for index, row in zip(indices.tolist(), picked.tolist(), strict=True):
            start, end = int(block.cu[row]), int(block.cu[row + 1])
            if "sparse" in outputs:
                if block.vocab is not None:
                    self.sparse[index] = block.vocab.row(row, self.multi.top_k)
                else:
                    weights = block.sparse[start:end]
                    self.sparse[index] = _merged(block.ids[row], weights, self.multi.unweighted)
            if "colbert" in outputs:  # every token's but the first, as BGE-M3 gives them
                self.colbert[index] = block.colbert[start + 1 : end].copy()

    def finished(self) -> np.ndarray:
        """The dense rows, cut and normalized here (the device left them raw); the sparse rows
        pruned to top_k and the ColBERT vectors normalized as the dense rows are."""
        spec = self.spec
        unit = spec.normalize or spec.model_normalizes
        if self.colbert and unit:
            self.colbert = [_unit(vectors) for vectors in self.colbert]
        top_k = self.multi.top_k
        if top_k is not None:
            self.sparse = [_top(row, top_k) for row in self.sparse]
        vectors = self.array
        if vectors.shape[1] == 0:
            return vectors
        if spec.model_normalizes and not spec.normalize:
            vectors = _unit(vectors)
        vectors = np.ascontiguousarray(vectors[:, : spec.dimensions])
        return _unit(vectors) if spec.normalize else vectors

    def extras(self) -> dict[str, Any]:
        """What the request gets beside its dense rows (EmbedResult's fields)."""
        outputs = self.multi.outputs
        return {
            "sparse": self.sparse if "sparse" in outputs else None,
            "colbert": self.colbert if "colbert" in outputs else None,
        }


_EMPTY = SparseRow(np.zeros(0, np.int64), np.zeros(0, np.float32))
_NO_VECTORS = np.zeros((0, 0), np.float32)


def _merged(ids: np.ndarray, weights: np.ndarray, unweighted: tuple[int, ...]) -> SparseRow:
    """Token weights merged by id as BGE-M3 merges them: the largest of each id's, kept where
    above 0 and the token is not one of `unweighted`."""
    kept = (weights > 0) & ~np.isin(ids, unweighted)
    unique, where = np.unique(ids[kept].astype(np.int64), return_inverse=True)
    values = np.zeros(len(unique), np.float32)
    np.maximum.at(values, where, weights[kept])
    return SparseRow(unique, values)


def _top(row: SparseRow, k: int) -> SparseRow:
    """The row's k largest weights, its ids still ascending."""
    if len(row.values) <= k:
        return row
    keep = np.sort(np.argpartition(-row.values, k - 1)[:k])
    return SparseRow(row.indices[keep], row.values[keep])


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    result: np.ndarray = vectors / np.maximum(norms, 1e-12)  # as F.normalize: zero stays zero
    return result
