"""A batch of texts packed end to end (no padding): built on the host, copied in one transfer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


# cuBLAS makes the host wait for the device the first time it meets a matrix shape
# (on an H200 with torch 2.11: 12 of 13 new row counts between 1,000 and 9,000 did, 4 of
# 13 between 20,000 and 60,000, 1 of 12 above 100,000). Beside a slower GPU that wait can be
# the slow GPU's whole queue while the fast one starves (0.74 s once, for BERT-large).
# So a GPU batch is padded to one of a bounded set of row counts, and the engine runs each
# once when a model loads: 16 an octave, 32 an octave from FINE_FROM rows up, where batches
# are large and padding costs the most.
FINE_FROM = 131072


def token_rows(tokens: int, most: int | None = None) -> int:
    """The rows a GPU batch of `tokens` tokens is padded to: at most 1/16 more (1/32 from
    FINE_FROM), and never past `most` (the device's budget) when the batch fits in it."""
    step = 1 << max(4, tokens.bit_length() - (5 if tokens < FINE_FROM else 6))
    rows = -(-tokens // step) * step
    return min(rows, most) if most is not None and tokens <= most else rows


def bucketed_rows(most: int) -> list[int]:
    """Every row count `token_rows` pads a batch of up to `most` tokens to."""
    counts = [token_rows(1, most)]
    while counts[-1] < most:
        counts.append(token_rows(counts[-1] + 1, most))
    return counts


@dataclass(frozen=True, slots=True)
class HostBatch:
    """Token ids of B texts, packed, as one int32 array: ids | positions | segments | cu_seqlens.

    The first three have R >= T rows: rows past T are padding (id 0, position 0), which
    attention leaves out and pooling never reads."""

    buffer: np.ndarray  # (3 * R + B + 1,) int32
    tokens: int  # T
    rows: int  # R
    count: int  # B
    max_len: int
    pinned: torch.Tensor | None = None  # the same memory as a pinned tensor, if staged there
    graph: tuple[int, int] | None = None  # (rows, texts) of the CUDA graph it is packed for


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """The same batch on a device. Row t of every (R, ...) tensor is token t; rows past
    `tokens` are padding."""

    input_ids: torch.Tensor  # (R,) int32
    positions: torch.Tensor  # (R,) int32, 0 at each text's first token
    segments: torch.Tensor  # (R,) int64, the text each token belongs to
    cu_seqlens: torch.Tensor  # (B + 1,) int32, text b is rows cu[b]:cu[b + 1]
    lengths: torch.Tensor  # (B,) float32
    count: int
    max_len: int
    tokens: int  # T, the real tokens

    @property
    def padded_index(self) -> torch.Tensor:
        """(T,) int64: each real token's row in a right-padded (B * max_len) layout."""
        t = self.tokens
        return self.segments[:t] * self.max_len + self.positions[:t].long()


def pack(
    token_ids: Sequence[np.ndarray],
    staging: Staging | None = None,
    budget: int | None = None,
    fit: Callable[[int, int], tuple[int, int] | None] | None = None,
) -> HostBatch:
    """Pack texts' token ids into one int32 array (in `staging`'s pinned memory if given),
    without a Python loop over tokens; given the device's `budget`, padded to `token_rows`.

    `fit(tokens, texts)` may give a fixed (rows, texts) shape a CUDA graph was captured for
    (engine/graphs.py), with rows > tokens: the batch is then padded to it with empty texts,
    the last of which holds the padding rows, so the graph's every read stays in bounds."""
    count = len(token_ids)
    lengths = np.fromiter(map(len, token_ids), dtype=np.int32, count=count)
    tokens = int(lengths.sum())
    graph = fit(tokens, count) if fit is not None else None
    if graph is not None:
        rows, texts = graph
    else:
        rows, texts = (token_rows(tokens, budget) if budget is not None else tokens), count
    size = 3 * rows + texts + 1
    pinned = staging.input(size) if staging is not None else None
    buffer = pinned.numpy() if pinned is not None else np.empty(size, dtype=np.int32)
    ids, positions, segments, cu = np.split(buffer, [rows, 2 * rows, 3 * rows])
    np.concatenate(token_ids, out=ids[:tokens], casting="unsafe")
    cu[0] = 0
    np.cumsum(lengths, out=cu[1 : count + 1])
    positions[:tokens] = np.arange(tokens, dtype=np.int32) - np.repeat(cu[:count], lengths)
    segments[:tokens] = np.repeat(np.arange(count, dtype=np.int32), lengths)
    ids[tokens:] = 0  # padding rows: id 0, position 0, and the last text's (or text 0's)
    positions[tokens:] = 0
    segments[tokens:] = texts - 1 if graph is not None else 0
    cu[count + 1 :] = tokens  # a graph's empty texts, the last ending at the last row
    if graph is not None:
        cu[texts] = rows
    return HostBatch(buffer, tokens, rows, count, int(lengths.max()), pinned, graph)


class Staging:
    """Pinned host memory for one batch in flight: its ids going in, its rows coming out.

    Allocated once and grown rarely, so launching a batch never waits on the allocator (a
    fresh pinned allocation can synchronize the device). Reuse it only once its batch is done.
    """

    def __init__(self) -> None:
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None  # bytes, viewed as each batch's rows

    def reserve(self, tokens: int, rows: int, row_bytes: int) -> None:
        """Allocate for batches up to `tokens` tokens and `rows` texts ahead of time."""
        import torch

        self.input(4 * tokens + 1)
        self.output(rows, row_bytes, torch.uint8)

    def input(self, size: int) -> torch.Tensor:
        import torch

        if self._input is None or self._input.numel() < size:
            self._input = torch.empty(_grown(size), dtype=torch.int32, pin_memory=True)
        return self._input[:size]

    def output(self, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        import torch

        size = rows * width * dtype.itemsize
        if self._output is None or self._output.numel() < size:
            self._output = torch.empty(_grown(size), dtype=torch.uint8, pin_memory=True)
        return self._output[:size].view(dtype).view(rows, width)


def _grown(size: int) -> int:
    return 1 << max(16, (size - 1).bit_length())


def to_device(host: HostBatch, device: torch.device) -> PackedBatch:
    """One host-to-device copy: non-blocking when the batch was packed into pinned memory."""
    import torch

    staged = host.pinned if host.pinned is not None else torch.from_numpy(host.buffer)
    if device.type != "cpu":
        staged = staged.to(device, non_blocking=host.pinned is not None)
    return packed_views(staged, host.rows, host.count, host.max_len, host.tokens)


def packed_views(
    staged: torch.Tensor, rows: int, count: int, max_len: int, tokens: int
) -> PackedBatch:
    """The batch's tensors read from its one int32 array (HostBatch.buffer's layout)."""
    r = rows
    cu = staged[3 * r :]
    return PackedBatch(
        input_ids=staged[:r],
        positions=staged[r : 2 * r],
        segments=staged[2 * r : 3 * r].long(),
        cu_seqlens=cu,
        lengths=(cu[1:] - cu[:-1]).float(),
        count=count,
        max_len=max_len,
        tokens=tokens,
    )
