"""SPLADE's vocabulary-wide rows cut on their device to what each row needs (its non-zero
weights, or its request's top k), so that a batch sends (B, k) weights and ids to the host, not
(B, V) floats; and read back on the host, exactly, a batch at a time.

A row's count of non-zeros is known only once the forward has run. Sizing the copy to it would
make the launch, which runs on the event loop, wait for the device; or take a second copy
after the batch, which on the model's stream queues behind the next batch in flight. So each
batch is cut to a bound known at launch, its **capacity**: the most non-zeros any row of this
replica has had, to a power of two (at most twice the need, and a bounded set of shapes), or
the batch's top_k where every request asks one. A row with more non-zeros than that (the first
batches, until the capacity has grown) is copied whole, when its batch is delivered, from the
batch's rows kept on the device until then: a copy on the loop's own stream, which nothing is
queued on, so it waits for those rows alone. Rows too full for the cut to save anything come
back whole, as before.

A batch's block, one float32 array, its int32 parts bit for bit:
    k | counts (B,) | weights (B, k) | ids (B, k)      each row's non-zeros among its k largest,
                                                      ids ascending, then its zeros (id V)
    DENSE | rows (B, V)                               where 2k + 1 >= V
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from embedx.engine.sparse_rows import SparseRows

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
        # ids ascending, the zeros (ranked past V) last: the host takes each row's lead as it is
        ids, order = torch.where(weights > 0, ids, vocab).sort(dim=1)
        weights = weights.gather(1, order)
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
    """A batch's sparse rows as its block holds them (views of the host buffer, valid until the
    slot's next launch), and on the device whole."""

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

    def sparse(self, top_k: int | None) -> SparseRows:
        """The batch's rows: all their non-zeros, or their `top_k` largest, ids ascending."""
        if self.k == DENSE:
            return SparseRows.of_dense(self.rows).top(top_k)
        counts = self.counts.astype(np.intp)
        wanted = counts if top_k is None else np.minimum(counts, top_k)
        short = np.flatnonzero(wanted > self.k)  # rows the cut left short: whole, from the device
        held = np.minimum(counts, self.k)  # each row's non-zeros in the block, its lead
        held[short] = 0
        lead = np.arange(self.k) < held[:, None]  # (B, k)
        row = np.repeat(np.arange(len(counts)), held)
        ids, weights = self.ids[lead], self.weights[lead]  # copies, in row order
        if len(short):
            whole = self.device_rows[short.tolist()].cpu().numpy()  # (S, V)
            more, more_ids = np.nonzero(whole)
            row = np.concatenate([row, short[more]])
            order = np.argsort(row, kind="stable")  # each row's entries together, ids ascending
            row = row[order]
            ids = np.concatenate([ids, more_ids])[order]
            weights = np.concatenate([weights, whole[more, more_ids]])[order]
        return SparseRows.of_entries(len(counts), row, ids, weights).top(top_k)
