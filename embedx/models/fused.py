"""Fused elementwise steps of the encoders: Triton kernels on CUDA, plain torch everywhere else.

Each step is one pass over memory instead of several. `fused_ops(device, dtype)` picks the
implementation once, when a model loads; the torch versions are the reference the tests
compare the kernels with, and what the CPU (and CI) runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

log = logging.getLogger("embedx.models")


class FusedOps(Protocol):
    def add_layer_norm(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        eps: float,
    ) -> torch.Tensor:
        """layer_norm(x + residual): (T, H)."""  # fmt: skip
        ...

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, rms_norm(x + residual)): the new residual stream and its norm."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for gate_up = [gate | up], (T, 2I) -> (T, I)."""
        ...

    def qk_norm_rope(
        self,
        qk: torch.Tensor,
        q_heads: int,
        k_heads: int,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head RMSNorm then rotary positions on q and k, from qk = [q | k] rows (stride
        free): returns contiguous q (T, Hq, D) and k (T, Hk, D)."""  # fmt: skip
        ...


class TorchOps:
    """The reference implementation: what transformers computes, step by step."""

    def add_layer_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
        eps: float,
    ) -> torch.Tensor:  # fmt: skip
        import torch.nn.functional as F

        return F.layer_norm(x + residual, (x.shape[-1],), weight, bias, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch.nn.functional as F

        total = x + residual
        return total, F.rms_norm(total, (total.shape[-1],), weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def qk_norm_rope(
        self, qk: torch.Tensor, q_heads: int, k_heads: int, q_weight: torch.Tensor,
        k_weight: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        import torch
        import torch.nn.functional as F

        tokens, dim = qk.shape[0], q_weight.shape[0]
        q = qk[:, : q_heads * dim].reshape(tokens, q_heads, dim)
        k = qk[:, q_heads * dim : (q_heads + k_heads) * dim].reshape(tokens, k_heads, dim)
        q = F.rms_norm(q, (dim,), q_weight, eps)
        k = F.rms_norm(k, (dim,), k_weight, eps)
        c = cos[positions].unsqueeze(1)  # (T, 1, D / 2)
        s = sin[positions].unsqueeze(1)

        def rotate(x: torch.Tensor) -> torch.Tensor:
            x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
            return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

        return rotate(q), rotate(k)


@dataclass(frozen=True, slots=True)
class TritonOps:
    """The same steps as TorchOps, each one Triton kernel (statistics in float32)."""

    kernels: Any  # the module holding the @triton.jit functions

    def add_layer_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
        eps: float,
    ) -> torch.Tensor:  # fmt: skip
        import torch

        rows, width = x.shape
        out = torch.empty_like(x)
        block = _pow2(width)
        self.kernels.add_layer_norm[(rows,)](
            x, residual, out, weight, bias, x.stride(0), residual.stride(0), width, eps,
            BLOCK=block, num_warps=_warps(block),
        )  # fmt: skip
        return out

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        rows, width = x.shape
        total = torch.empty_like(x)
        normed = torch.empty_like(x)
        block = _pow2(width)
        self.kernels.add_rms_norm[(rows,)](
            x, residual, total, normed, weight, x.stride(0), residual.stride(0), width, eps,
            BLOCK=block, num_warps=_warps(block),
        )  # fmt: skip
        return total, normed

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        import torch

        rows, double = gate_up.shape
        width = double // 2
        out = torch.empty((rows, width), dtype=gate_up.dtype, device=gate_up.device)
        block = min(_pow2(width), 4096)
        grid = (rows, (width + block - 1) // block)
        self.kernels.silu_mul[grid](gate_up, out, gate_up.stride(0), width, BLOCK=block)
        return out

    def qk_norm_rope(
        self, qk: torch.Tensor, q_heads: int, k_heads: int, q_weight: torch.Tensor,
        k_weight: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        import torch

        tokens, dim = qk.shape[0], q_weight.shape[0]
        if _pow2(dim // 2) != dim // 2:  # the kernel tiles a head's halves by powers of two
            args = (qk, q_heads, k_heads, q_weight, k_weight, positions, cos, sin, eps)
            return TorchOps().qk_norm_rope(*args)
        q = torch.empty((tokens, q_heads, dim), dtype=qk.dtype, device=qk.device)
        k = torch.empty((tokens, k_heads, dim), dtype=qk.dtype, device=qk.device)
        for out, heads, weight, offset in (
            (q, q_heads, q_weight, 0),
            (k, k_heads, k_weight, q_heads * dim),
        ):
            self.kernels.head_norm_rope[(tokens,)](
                qk, out, weight, positions, cos, sin, qk.stride(0), offset, eps,
                HEADS=heads, DIM=dim, HEADS_BLOCK=_pow2(heads), num_warps=4,
            )  # fmt: skip
        return q, k


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _warps(block: int) -> int:
    return max(1, min(16, block // 256))


def fused_ops(device: torch.device, dtype: torch.dtype) -> FusedOps:
    """Triton kernels on a CUDA device in half precision when Triton imports; else torch."""
    import torch

    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return TorchOps()
    try:
        from embedx.models import triton_kernels
    except ImportError as exc:  # no Triton (or no compiler for it): the torch path still works
        log.info("Triton is not available (%s); using unfused torch steps", exc)
        return TorchOps()
    return TritonOps(triton_kernels)
