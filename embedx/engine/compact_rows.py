"""SPLADE's vocabulary-wide rows cut on their device to what each row needs (its non-zero
weights, or its request's top k), so that a batch sends (B, k) weights and ids to the host, not
(B, V) floats; and read back on the host, exactly.

A row's count of non-zeros is known only once the forward has run. Sizing the copy to it would
make the launch, which runs on the event loop, wait for the device; or take a second copy
after the batch, which on the model's stream queues behind the next batch in flight. So each
batch is cut to a bound known at launch, its **capacity**: the most non-zeros any row of this
replica has had, to a power of two (at most twice the need, and a bounded set of shapes), or
the batch's top_k where every request asks one. A row with more non-zeros than that (the first
batches, until the capacity has grown) is copied whole, when its batch is delivered, from the
batch's rows kept on the device until then: a copy on the loop's own stream, which nothing is
queued on, so it waits for that row alone. Rows too full for the cut to save anything come
back whole, as before.

A batch's block, one float32 array, its int32 parts bit for bit:
    k | counts (B,) | weights (B, k) | ids (B, k)      each row's largest first, then zeros
    DENSE | rows (B, V)                               where 2k + 1 >= V
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from embedx.engine.sparse_rows import SparseRow

if TYPE_CHECKING:
    import torch

DENSE = -1  # the header of a block of whole rows
FIRST_CAPACITY = 256  # a trained SPLADE's passages have about 100 to 300 non-zeros


@dataclass(slots=True)
class _Kept:
    out: torch.Tensor  # the block as the host receives it
    rows: torch.Tensor  # (B, V) on the device


class Compactor:
    """One replica's cutting of its batches' rows: its capacity, and each slot's rows kept on
    the device until its batch is delivered."""

    __slots__ = ("_kept", "capacity")

    def __init__(self) -> None:
        self.capacity = FIRST_CAPACITY
        self._kept: dict[int, _Kept] = {}

    def cut(self, rows: torch.Tensor, top_k: int | None) -> torch.Tensor:
        """(B, V) rows (0 or more) to a (1, N) block, on their device and its stream."""
        import torch

        vocab = rows.shape[1]
        k = self.capacity if top_k is None else min(self.capacity, top_k)
        header = torch.empty(1, dtype=torch.int32, device=rows.device)
        if 2 * k + 1 >= vocab:  # the cut would send as much as the rows
            return torch.cat([header.fill_(DENSE).view(torch.float32), rows.reshape(-1)])[None]
        counts = (rows > 0).sum(1, dtype=torch.int32)  # (B,)
        weights, ids = rows.topk(k, dim=1)  # (B, k) each, largest first: the non-zeros lead
        parts = [header.fill_(k), counts, weights, ids.to(torch.int32)]
        return torch.cat([p.view(torch.float32).reshape(-1) for p in parts])[None]

    def keep(self, slot: int, out: torch.Tensor, rows: torch.Tensor) -> None:
        """Keep a batch's device rows until it is delivered (`taken`): out of the slot's
        batch before, which was delivered or failed."""
        self._kept[slot] = _Kept(out, rows)

    def taken(self, out: torch.Tensor) -> VocabRows | None:
        """The delivered batch's rows as the host reads them (None for a batch of no sparse
        rows); the capacity grown to its rows' counts. `out` is in host memory, finished."""
        slot = next((s for s, kept in self._kept.items() if kept.out is out), None)
        if slot is None:
            return None
        kept = self._kept.pop(slot)
        read = VocabRows(out.numpy().reshape(-1), kept.rows)
        if read.k != DENSE and len(read.counts):
            most = int(read.counts.max())
            if most > self.capacity:
                self.capacity = 1 << (most - 1).bit_length()
        return read


class VocabRows:
    """A batch's sparse rows read from its block (views of the host buffer, valid until the
    slot's next launch); a row the cut left short is copied whole from the device."""

    __slots__ = ("counts", "device_rows", "ids", "k", "rows", "weights")

    def __init__(self, block: np.ndarray, device_rows: torch.Tensor) -> None:
        count, vocab = device_rows.shape
        self.device_rows = device_rows
        self.k = int(block[:1].view(np.int32)[0])
        self.counts = self.ids = self.weights = self.rows = block[:0]
        if self.k == DENSE:
            self.rows = block[1:].reshape(count, vocab)
            return
        k = self.k
        self.counts = block[1 : 1 + count].view(np.int32)
        start = 1 + count
        self.weights = block[start : start + count * k].reshape(count, k)
        self.ids = block[start + count * k : start + 2 * count * k].view(np.int32)
        self.ids = self.ids.reshape(count, k)

    def row(self, b: int, top_k: int | None) -> SparseRow:
        """Text b's row: all its non-zeros, or its `top_k` largest, ids ascending."""
        if self.k == DENSE:
            return nonzero(self.rows[b])
        wanted = int(self.counts[b]) if top_k is None else min(int(self.counts[b]), top_k)
        if wanted > self.k:  # cut short: the whole row, from the device
            return nonzero(self.device_rows[b].cpu().numpy())
        ids = self.ids[b, :wanted]
        order = np.argsort(ids)
        return SparseRow(ids[order].astype(np.int64), self.weights[b, :wanted][order])


def nonzero(row: np.ndarray) -> SparseRow:
    """A whole (V,) row's non-zeros."""
    indices = np.flatnonzero(row)
    return SparseRow(indices.astype(np.int64), row[indices].astype(np.float32))
