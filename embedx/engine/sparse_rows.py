"""Rows beyond one dense vector a text: sparse rows (SPLADE's vocabulary-wide ones, BGE-M3's token
weights merged by id) and ColBERT token vectors. What a request asks of them is settled once; a
batch's flat block from the device is read back into each request's rows on the host, a batch
at a time (no work a text but taking its views).

A batch's block holds the outputs its requests want, in `OUTPUTS`' order, each flattened:
dense (B, D) rows; sparse rows: SPLADE's, cut on the device to each row's non-zeros
(engine/compact_rows.py), or BGE-M3's token weights merged by id on the device, its int32 parts
bit for bit: offsets (B + 1) | ids (T) | weights (T), text b's ids ascending at
offsets[b]:offsets[b + 1] (models/m3.py); colbert (T - B, C) token vectors, every token's but
each text's first (BGE-M3 gives none for it), L2-normalized there where the batch's form says.
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
    from embedx.engine.outputs import OutputSpec, RowForm
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
class SparseRows:
    """A batch's sparse rows end to end: text b's ids (ascending) and weights are
    indices[offsets[b]:offsets[b + 1]] and values[...], arrays of their own."""

    offsets: np.ndarray  # (B + 1,) intp
    indices: np.ndarray  # (N,) int64
    values: np.ndarray  # (N,) float32

    @classmethod
    def of_entries(
        cls, count: int, rows: np.ndarray, indices: np.ndarray, values: np.ndarray
    ) -> SparseRows:
        """From entries in row order, each row's ids ascending (arrays of their own)."""
        offsets = np.zeros(count + 1, np.intp)
        np.cumsum(np.bincount(rows, minlength=count), out=offsets[1:])
        # contiguous: a 2-d array's np.nonzero gives strided views, and rows are sent as they are
        return cls(offsets, np.ascontiguousarray(indices, np.int64),
                   np.ascontiguousarray(values, np.float32))  # fmt: skip

    @classmethod
    def of_dense(cls, rows: np.ndarray) -> SparseRows:
        """(B, V) whole rows' non-zeros."""
        row, indices = np.nonzero(rows)
        return cls.of_entries(len(rows), row, indices, rows[row, indices])

    def row(self, b: int) -> SparseRow:
        """Text b's row: views of this batch's arrays."""
        start, end = self.offsets[b], self.offsets[b + 1]
        return SparseRow(self.indices[start:end], self.values[start:end])

    def top(self, k: int | None) -> SparseRows:
        """Each row's k largest weights (all with k None), its ids still ascending."""
        lengths = np.diff(self.offsets)
        if k is None or lengths.max(initial=0) <= k:
            return self
        rows = np.repeat(np.arange(len(lengths)), lengths)
        order = np.lexsort((-self.values, rows))  # by row, then largest first
        rank = np.empty(len(order), np.intp)
        rank[order] = np.arange(len(order)) - self.offsets[rows]  # rows[order] is rows
        kept = rank < k
        offsets = np.zeros_like(self.offsets)
        np.cumsum(np.minimum(lengths, k), out=offsets[1:])
        return SparseRows(offsets, self.indices[kept], self.values[kept])


@dataclass(frozen=True, slots=True)
class MultiSpec:
    """What a request asks beyond dense rows, settled against its model."""

    outputs: tuple[str, ...]  # in OUTPUTS' order
    top_k: int | None  # a sparse row keeps its k largest weights
    vocab_rows: bool  # sparse rows come vocabulary-wide (SPLADE), else merged on the device


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
    return MultiSpec(wanted, top_k, task.splade is not None)


class Block:
    """A finished batch's flat block, cut into its outputs: views of the device's buffer, valid
    until its next launch, but for its merged sparse rows, copied out. SPLADE's rows are read
    through `vocab` (its whole block)."""

    __slots__ = ("_merged", "_sparse", "colbert", "dense", "starts", "unit", "vocab")

    def __init__(
        self, items: Sequence[Item], block: np.ndarray, form: RowForm, width: int,
        vocab: VocabRows | None,
    ) -> None:  # fmt: skip
        count = len(items)
        lengths = np.fromiter((item.length for item in items), np.intp, count)
        tokens = int(lengths.sum())
        # text b's ColBERT vectors are rows starts[b]:starts[b + 1], its first token's left out
        self.starts = np.zeros(count + 1, np.intp)
        np.cumsum(lengths - 1, out=self.starts[1:])
        self.unit = form.unit  # the ColBERT vectors came L2-normalized
        self.vocab = vocab
        self._merged: SparseRows | None = None
        self._sparse: dict[int | None, SparseRows] = {}
        outputs = form.outputs
        flat = block.reshape(-1)
        self.dense = self.colbert = flat[:0]
        start = 0
        if "dense" in outputs:
            self.dense = flat[: count * width].reshape(count, width)
            start = count * width
        if "sparse" in outputs and vocab is None:
            offsets = flat[start : start + count + 1].view(np.int32)
            found = int(offsets[-1])
            ids = flat[start + count + 1 :][:found].view(np.int32)
            weights = flat[start + count + 1 + tokens :][:found]
            self._merged = SparseRows(offsets.astype(np.intp), ids.astype(np.int64), weights.copy())
            start += count + 1 + 2 * tokens
        if "colbert" in outputs:
            vectors = int(self.starts[-1])
            self.colbert = flat[start:].reshape(vectors, -1) if vectors else flat[:0].reshape(0, 0)

    def sparse(self, top_k: int | None) -> SparseRows:
        """The batch's sparse rows, each cut to its `top_k` largest weights; read once a top_k
        (requests that share the batch may ask different ones)."""
        rows = self._sparse.get(top_k)
        if rows is None:
            if self.vocab is not None:
                rows = self.vocab.sparse(top_k)
            else:
                assert self._merged is not None, "sparse rows read from a block of none: a bug"
                rows = self._merged.top(top_k)
            self._sparse[top_k] = rows
        return rows


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
        out of a batch's block: each output in one piece, each text's row a view of it."""
        outputs = self.multi.outputs
        if "dense" in outputs:
            self.array[indices] = block.dense[picked]
        if "sparse" in outputs:
            rows = block.sparse(self.multi.top_k)
            for index, row in zip(indices.tolist(), picked.tolist(), strict=True):
                self.sparse[index] = rows.row(row)
        if "colbert" in outputs:
            starts = block.starts[picked]
            counts = block.starts[picked + 1] - starts
            ends = np.cumsum(counts)
            # each of the texts' vectors' row in the block, the texts end to end
            rows = np.arange(ends[-1]) + np.repeat(starts - (ends - counts), counts)
            vectors = block.colbert[rows]  # a copy: the block is the device's buffer
            if self.spec.unit and not block.unit:  # a batch shared with requests for raw vectors
                vectors = _unit(vectors)
            for index, start, end in zip(indices.tolist(), (ends - counts).tolist(),
                                         ends.tolist(), strict=True):  # fmt: skip
                self.colbert[index] = vectors[start:end]

    def finished(self) -> np.ndarray:
        """The dense rows, cut and normalized here (the device left them raw)."""
        spec = self.spec
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


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    result: np.ndarray = vectors / np.maximum(norms, 1e-12)  # as F.normalize: zero stays zero
    return result
