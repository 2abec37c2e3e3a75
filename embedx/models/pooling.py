"""Pooling of token states into one vector per text (SPLADE's over vocabulary logits is
`models/splade.py`'s)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from embedx.errors import InvalidOption

if TYPE_CHECKING:
    import torch


class Pooling(enum.Enum):
    CLS = "cls"
    MEAN = "mean"
    LAST_TOKEN = "last_token"
    SPLADE = "splade"  # a masked LM's logits, max-pooled into one vocabulary-wide sparse row

    @classmethod
    def parse(cls, value: str, *, param: str = "pooling") -> Pooling:
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(p.value for p in cls)
            raise InvalidOption(f"pooling {value!r} is not one of {choices}", param=param) from None


def pooled_rows(cu_seqlens: torch.Tensor, pooling: Pooling) -> torch.Tensor | None:
    """(B,) int64: the row of each text's one pooled token, or None for mean pooling."""
    if pooling is Pooling.CLS:
        return cu_seqlens[:-1].long()
    if pooling is Pooling.LAST_TOKEN:
        return cu_seqlens[1:].long() - 1
    return None


def row_bucket(count: int) -> int:
    """The power of two (64 at least) that `count` rows are padded to."""
    return 1 << max(6, (count - 1).bit_length())


def bucketed(rows: torch.Tensor) -> torch.Tensor:
    """`rows` padded with copies of its last one to `row_bucket(len(rows))` entries.

    On CUDA a new row count makes cuBLAS wait for the device (see packing.token_rows), and
    the pooled rows' count changes with every batch; a few bucketed counts, warmed when
    the model loads, leave launches asynchronous.
    """
    import torch

    count = rows.shape[0]
    padded = row_bucket(count)
    if padded == count:
        return rows
    return torch.cat((rows, rows[-1:].expand(padded - count)))


def pool(
    hidden: torch.Tensor,  # (T, H): every text's token states, packed end to end
    cu_seqlens: torch.Tensor,  # (B + 1,) int32: text b owns rows cu[b]:cu[b + 1]
    segments: torch.Tensor,  # (T,) int64: which text each row belongs to
    lengths: torch.Tensor,  # (B,) float32: tokens per text
    pooling: Pooling,
) -> torch.Tensor:
    """One float32 vector per text, (B, H). Sums run in float32 whatever the model's dtype."""
    import torch

    rows = pooled_rows(cu_seqlens, pooling)
    if rows is not None:
        return hidden[rows].float()
    sums = torch.zeros(
        (lengths.shape[0], hidden.shape[1]), dtype=torch.float32, device=hidden.device
    )
    sums.index_add_(0, segments, hidden.float())
    return sums / lengths.unsqueeze(1)
