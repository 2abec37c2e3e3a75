"""Attention over packed texts: flash varlen on CUDA in half precision, padded SDPA elsewhere.

The choice is made once, when a model loads, not inside its forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from embedx.models.packing import PackedBatch

# (q, k (T, Hkv, D), v (T, Hkv, D), batch, causal, scale, one_per_text) -> like q.
# q is (T, Hq, D), or with one_per_text a row per text, (B', Hq, D), that sees its whole
# text (causal is then False). Rows past the real ones (B texts, or T tokens: bucketed
# counts) are padding: they come out 0 or as whatever the kernel left there.
Attention = Callable[
    ["torch.Tensor", "torch.Tensor", "torch.Tensor", "PackedBatch", bool, float, bool],
    "torch.Tensor",
]


def choose_attention(device: torch.device, dtype: torch.dtype) -> Attention:
    import torch

    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        return flash_varlen_attention
    return padded_attention


def flash_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch: PackedBatch,
    causal: bool,
    scale: float,
    one_per_text: bool,
) -> torch.Tensor:
    """FlashAttention-2 over the packed rows: no padding, grouped KV heads handled natively."""
    import torch

    cu = batch.cu_seqlens
    cu_q, max_q = cu, batch.max_len
    if one_per_text:
        cu_q, max_q = torch.arange(batch.count + 1, dtype=cu.dtype, device=cu.device), 1
    out = torch.ops.aten._flash_attention_forward(
        q[: batch.count] if one_per_text else q,
        k, v, cu_q, cu, max_q, batch.max_len, 0.0, causal, False, scale=scale,
    )  # fmt: skip
    return _rows_like(out[0], q)


def _rows_like(out: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """`out` with zero rows appended up to q's row count (bucketed rows)."""
    import torch.nn.functional as F

    extra = q.shape[0] - out.shape[0]
    return F.pad(out, (0, 0, 0, 0, 0, extra)) if extra else out


def padded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch: PackedBatch,
    causal: bool,
    scale: float,
    one_per_text: bool,
) -> torch.Tensor:
    """Scatter the packed rows into a right-padded batch, run SDPA with a key mask, gather.

    Right padding keeps causal attention exact: a real token only sees earlier positions.
    """
    import torch
    import torch.nn.functional as F

    count, width = batch.count, batch.max_len
    where = batch.padded_index

    def padded(x: torch.Tensor) -> torch.Tensor:
        heads, dim = x.shape[1], x.shape[2]
        out = x.new_zeros((count * width, heads, dim))
        out[where] = x[: batch.tokens]
        return out.view(count, width, heads, dim).transpose(1, 2)  # (B, h, L, D)

    qp = q[:count].unsqueeze(2) if one_per_text else padded(q)  # (B, Hq, 1 or L, D)
    kp, vp = padded(k), padded(v)
    mask = None
    if not causal:
        valid = torch.arange(width, device=q.device) < batch.lengths.unsqueeze(1)  # (B, L)
        mask = valid[:, None, None, :]  # (B, 1, 1, L)
    out = F.scaled_dot_product_attention(
        qp,
        kp,
        vp,
        attn_mask=mask,
        is_causal=causal,
        scale=scale,
        enable_gqa=kp.shape[1] != qp.shape[1],
    )  # (B, Hq, L or 1, D)
    if one_per_text:
        return _rows_like(out.squeeze(2), q)
    return _rows_like(out.transpose(1, 2).reshape(count * width, q.shape[1], q.shape[2])[where], q)
