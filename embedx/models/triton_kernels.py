"""Triton kernels for the fused steps in `fused.py` (imported only on CUDA). One program per
token row; statistics and arithmetic in float32, results stored in the model's dtype."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def add_layer_norm(X, R, Y, W, B, stride_x, stride_r, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    h = x + r
    mean = tl.sum(h, axis=0) / N
    centered = tl.where(mask, h - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, (centered * rstd * w + b).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def add_rms_norm(X, R, TOTAL, Y, W, stride_x, stride_r, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    total = (x + r).to(TOTAL.dtype.element_ty)  # the residual stream stays in the model dtype
    tl.store(TOTAL + row * N + cols, total, mask=mask)
    h = total.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, (h * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def silu_mul(GU, OUT, stride, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    gate = tl.load(GU + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GU + row * stride + N + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(OUT + row * N + cols, out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def head_norm_rope(
    QK, OUT, W, POS, COS, SIN, stride, offset, eps,
    HEADS: tl.constexpr, DIM: tl.constexpr, HEADS_BLOCK: tl.constexpr,
):  # fmt: skip
    """RMSNorm over each head's DIM values, then rotate its halves by the token's angle."""
    half: tl.constexpr = DIM // 2
    row = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, HEADS_BLOCK)[:, None]  # (H, 1)
    cols = tl.arange(0, half)[None, :]  # (1, D / 2)
    valid = heads < HEADS
    base = QK + row * stride + offset + heads * DIM
    x1 = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32)  # (H, D / 2)
    x2 = tl.load(base + half + cols, mask=valid, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / DIM + eps)
    w1 = tl.load(W + cols).to(tl.float32)
    w2 = tl.load(W + half + cols).to(tl.float32)
    # rounded to the model dtype between the norm and the rotation, as the torch path does
    n1 = (x1 * rstd[:, None] * w1).to(OUT.dtype.element_ty).to(tl.float32)
    n2 = (x2 * rstd[:, None] * w2).to(OUT.dtype.element_ty).to(tl.float32)
    position = tl.load(POS + row).to(tl.int64)
    c = tl.load(COS + position * half + cols).to(tl.float32)
    s = tl.load(SIN + position * half + cols).to(tl.float32)
    out = OUT + row * HEADS * DIM + heads * DIM
    tl.store(out + cols, (n1 * c - n2 * s).to(OUT.dtype.element_ty), mask=valid)
    tl.store(out + half + cols, (n2 * c + n1 * s).to(OUT.dtype.element_ty), mask=valid)
