"""A batch of texts packed end to end (no padding): built on the host, copied in one transfer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class HostBatch:
    """Token ids of B texts, packed, as one int32 array: ids | positions | segments | cu_seqlens."""

    buffer: np.ndarray  # (3 * T + B + 1,) int32
    tokens: int  # T
    count: int  # B
    max_len: int


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """The same batch on a device. Row t of every (T, ...) tensor is token t."""

    input_ids: torch.Tensor  # (T,) int32
    positions: torch.Tensor  # (T,) int32, 0 at each text's first token
    segments: torch.Tensor  # (T,) int64, the text each token belongs to
    cu_seqlens: torch.Tensor  # (B + 1,) int32, text b is rows cu[b]:cu[b + 1]
    lengths: torch.Tensor  # (B,) float32
    count: int
    max_len: int

    @property
    def padded_index(self) -> torch.Tensor:
        """(T,) int64: each token's row in a right-padded (B * max_len) layout."""
        return self.segments * self.max_len + self.positions.long()


def pack(token_ids: Sequence[Sequence[int]]) -> HostBatch:
    """Pack texts' token ids into one int32 array, without a Python loop over tokens."""
    count = len(token_ids)
    lengths = np.fromiter(map(len, token_ids), dtype=np.int32, count=count)
    tokens = int(lengths.sum())
    buffer = np.empty(3 * tokens + count + 1, dtype=np.int32)
    ids, positions, segments, cu = np.split(buffer, [tokens, 2 * tokens, 3 * tokens])
    ids[:] = np.fromiter(chain.from_iterable(token_ids), dtype=np.int32, count=tokens)
    cu[0] = 0
    np.cumsum(lengths, out=cu[1:])
    positions[:] = np.arange(tokens, dtype=np.int32) - np.repeat(cu[:-1], lengths)
    segments[:] = np.repeat(np.arange(count, dtype=np.int32), lengths)
    return HostBatch(buffer, tokens, count, int(lengths.max()))


def to_device(host: HostBatch, device: torch.device, pinned: bool) -> PackedBatch:
    """One host-to-device copy (non-blocking from pinned memory on CUDA)."""
    import torch

    staged = torch.from_numpy(host.buffer)
    if device.type != "cpu":
        if pinned:
            staged = staged.pin_memory()
        staged = staged.to(device, non_blocking=pinned)
    t, b = host.tokens, host.count
    cu = staged[3 * t :]
    return PackedBatch(
        input_ids=staged[:t],
        positions=staged[t : 2 * t],
        segments=staged[2 * t : 3 * t].long(),
        cu_seqlens=cu,
        lengths=(cu[1:] - cu[:-1]).float(),
        count=b,
        max_len=host.max_len,
    )
