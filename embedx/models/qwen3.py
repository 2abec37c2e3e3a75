"""Qwen3 decoder as an embedding model (Qwen3-Embedding), all of the forward in this one file.

Texts run packed with causal varlen attention, grouped KV heads, per-head RMSNorm on Q and K,
rotary positions and a SwiGLU MLP. Q/K/V and gate/up are fused when the weights load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from embedx.errors import NativeCodeLacks
from embedx.models.attention import choose_attention
from embedx.models.fused import fused_ops
from embedx.models.weights import Checkpoint

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from embedx.models.packing import PackedBatch

MODEL_TYPES = ("qwen3",)


@dataclass(frozen=True, slots=True)
class Qwen3Config:
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int  # explicit in Qwen3: not hidden // heads
    intermediate: int
    eps: float
    rope_theta: float
    max_positions: int

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> Qwen3Config:
        if config.get("use_sliding_window"):
            raise NativeCodeLacks("sliding-window attention is not supported by the Qwen3 code")
        if config.get("hidden_act", "silu") != "silu":
            raise NativeCodeLacks("only the SiLU (SwiGLU) Qwen3 MLP is supported")
        if config.get("attention_bias"):
            raise NativeCodeLacks("attention biases are not supported by the Qwen3 code")
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        kind = rope.get("rope_type") or rope.get("type") or "default"  # `type`: older configs
        if kind != "default":
            raise NativeCodeLacks(f"rope type {kind!r} is not supported")
        theta = rope.get("rope_theta", config.get("rope_theta", 1_000_000.0))
        heads = config["num_attention_heads"]
        return cls(
            vocab_size=config["vocab_size"],
            hidden=config["hidden_size"],
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            intermediate=config["intermediate_size"],
            eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_positions=config.get("max_position_embeddings", 32768),
        )

    @property
    def max_tokens(self) -> int:
        return self.max_positions


@dataclass(slots=True)
class _Layer:
    attn_norm: torch.Tensor  # (H,)
    qkv_w: torch.Tensor  # ((nq + 2 nkv) * hd, H)
    q_norm: torch.Tensor  # (hd,)
    k_norm: torch.Tensor  # (hd,)
    o_w: torch.Tensor  # (H, nq * hd)
    mlp_norm: torch.Tensor  # (H,)
    gate_up_w: torch.Tensor  # (2I, H): gate then up
    down_w: torch.Tensor  # (H, I)


class Qwen3Encoder:
    """Packed token ids in, final (normed) hidden states out: (T,) -> (T, H)."""

    causal = True

    def __init__(
        self,
        config: Qwen3Config,
        weights: list[Path],
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        import torch

        self.config = config
        c = config
        h, hd, inter = c.hidden, c.head_dim, c.intermediate
        ckpt = Checkpoint(weights, ("model.",), probe="embed_tokens.weight")

        def get(name: str, *shape: int) -> torch.Tensor:
            return ckpt.get(name, shape, device, dtype)

        self.embed = get("embed_tokens.weight", c.vocab_size, h)
        self.norm = get("norm.weight", h)
        self.layers: list[_Layer] = []
        for i in range(c.layers):
            p = f"layers.{i}."
            self.layers.append(
                _Layer(
                    attn_norm=get(p + "input_layernorm.weight", h),
                    qkv_w=torch.cat(
                        [
                            get(p + "self_attn.q_proj.weight", c.heads * hd, h),
                            get(p + "self_attn.k_proj.weight", c.kv_heads * hd, h),
                            get(p + "self_attn.v_proj.weight", c.kv_heads * hd, h),
                        ]
                    ),
                    q_norm=get(p + "self_attn.q_norm.weight", hd),
                    k_norm=get(p + "self_attn.k_norm.weight", hd),
                    o_w=get(p + "self_attn.o_proj.weight", h, c.heads * hd),
                    mlp_norm=get(p + "post_attention_layernorm.weight", h),
                    gate_up_w=torch.cat(
                        [
                            get(p + "mlp.gate_proj.weight", inter, h),
                            get(p + "mlp.up_proj.weight", inter, h),
                        ]
                    ),
                    down_w=get(p + "mlp.down_proj.weight", h, inter),
                )
            )
        # Rotary tables, computed in float32 and cast as transformers does: (P, hd / 2).
        inv_freq = 1.0 / (
            c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=device) / hd)
        )
        angles = torch.outer(torch.arange(c.max_positions, device=device).float(), inv_freq)
        self.cos = angles.cos().to(dtype)
        self.sin = angles.sin().to(dtype)
        self.attention = choose_attention(device, dtype)
        self.ops = fused_ops(device, dtype)
        self.scale = 1.0 / math.sqrt(hd)
        self.q_width = c.heads * hd
        self.qk_width = (c.heads + c.kv_heads) * hd

    def forward(self, batch: PackedBatch, pooled: torch.Tensor | None = None) -> torch.Tensor:
        import torch.nn.functional as F

        c, ops = self.config, self.ops
        tokens = batch.input_ids.shape[0]
        x = self.embed[batch.input_ids]  # (T, H): the residual stream
        h = F.rms_norm(x, (c.hidden,), self.layers[0].attn_norm, c.eps)
        for i, layer in enumerate(self.layers):
            qkv = F.linear(h, layer.qkv_w)  # (T, (nq + 2 nkv) * hd)
            q, k = ops.qk_norm_rope(
                qkv, c.heads, c.kv_heads, layer.q_norm, layer.k_norm,
                batch.positions, self.cos, self.sin, c.eps,
            )  # fmt: skip
            v = qkv[:, self.qk_width :].view(tokens, c.kv_heads, c.head_dim)
            rows_only = pooled is not None and i + 1 == len(self.layers)
            if rows_only:  # the pooled rows only: a last token sees its whole text
                q, x = q[pooled], x[pooled]
            a = self.attention(q, k, v, batch, not rows_only, self.scale, rows_only)
            attended = F.linear(a.reshape(-1, self.q_width), layer.o_w)
            x, h = ops.add_rms_norm(attended, x, layer.mlp_norm, c.eps)
            mlp = F.linear(ops.silu_mul(F.linear(h, layer.gate_up_w)), layer.down_w)
            following = self.layers[i + 1].attn_norm if i + 1 < len(self.layers) else self.norm
            x, h = ops.add_rms_norm(mlp, x, following, c.eps)  # each add feeds the next norm
        return h  # the final norm of the last residual stream

    def warm_matmuls(self, rows: int) -> None:
        """One layer's projections for `rows` token rows, called as `forward` calls them:
        every matrix shape a batch of that many rows meets, at a layer's cost (see
        ReplicaModel.matmuls)."""
        import torch
        import torch.nn.functional as F

        layer = self.layers[0]
        with torch.inference_mode():
            device, dtype = self.embed.device, self.embed.dtype
            h = torch.zeros(rows, self.config.hidden, device=device, dtype=dtype)
            F.linear(h, layer.qkv_w)
            F.linear(torch.zeros(rows, self.q_width, device=device, dtype=dtype), layer.o_w)
            F.linear(self.ops.silu_mul(F.linear(h, layer.gate_up_w)), layer.down_w)
