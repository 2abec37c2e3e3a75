"""BERT-family encoders (BERT, RoBERTa, XLM-RoBERTa), all of the forward in this one file.

Texts run packed end to end with no padding: every linear layer sees only real tokens, and
attention is varlen. Q, K and V are fused into one matrix when the weights load.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from embedx.errors import InvalidModel, NativeCodeLacks
from embedx.models.attention import choose_attention
from embedx.models.fused import fused_ops
from embedx.models.pairs import split_types
from embedx.models.weights import Checkpoint

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from embedx.models.packing import PackedBatch

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert")
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclass(frozen=True, slots=True)
class BertConfig:
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int
    type_vocab_size: int
    eps: float
    activation: str
    position_offset: int  # see `position_offset`

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> BertConfig:
        activation = config.get("hidden_act", "gelu")
        if activation not in ACTIVATIONS:
            raise NativeCodeLacks(f"hidden_act {activation!r} is not supported by the BERT code")
        # not left to transformers under `auto`: transformers 5 dropped relative positions and
        # would run such a checkpoint with absolute ones, giving wrong vectors
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise InvalidModel("only absolute position embeddings are supported")
        return cls(
            vocab_size=config["vocab_size"],
            hidden=config["hidden_size"],
            layers=config["num_hidden_layers"],
            heads=config["num_attention_heads"],
            intermediate=config["intermediate_size"],
            max_positions=config["max_position_embeddings"],
            type_vocab_size=config.get("type_vocab_size", 2),
            eps=config.get("layer_norm_eps", 1e-12),
            activation=activation,
            position_offset=position_offset(config),
        )

    @property
    def max_tokens(self) -> int:
        """The longest text the position table covers."""
        return self.max_positions - self.position_offset


def position_offset(config: dict[str, Any]) -> int:
    """The first position's index: RoBERTa numbers positions from padding_idx + 1 (2 for
    XLM-R), BERT from 0."""
    if config.get("model_type", "bert") == "bert":
        return 0
    return int(config.get("pad_token_id", 1)) + 1


@dataclass(slots=True)
class _Layer:
    qkv_w: torch.Tensor  # (3H, H): query, key and value stacked
    qkv_b: torch.Tensor
    out_w: torch.Tensor
    out_b: torch.Tensor
    norm1: tuple[torch.Tensor, torch.Tensor]  # LayerNorm weight and bias
    up_w: torch.Tensor  # (I, H)
    up_b: torch.Tensor
    down_w: torch.Tensor  # (H, I)
    down_b: torch.Tensor
    norm2: tuple[torch.Tensor, torch.Tensor]


class BertEncoder:
    """Packed token ids in, final hidden states out: (T,) -> (T, H)."""

    causal = False

    def __init__(
        self,
        config: BertConfig,
        weights: list[Path],
        device: torch.device,
        dtype: torch.dtype,
        token_types: bool = False,
    ) -> None:
        """`token_types`: batches are pairs whose ids carry their token types (`pairs`)."""
        import torch
        import torch.nn.functional as F

        self.config = config
        c = config
        h, inter = c.hidden, c.intermediate
        ckpt = Checkpoint(
            weights,
            ("bert.", "roberta.", "model."),
            probe="embeddings.word_embeddings.weight",
        )

        def get(name: str, *shape: int) -> torch.Tensor:
            return ckpt.get(name, shape, device, dtype)

        def layer_norm(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            if name + ".weight" in ckpt:
                return get(name + ".weight", h), get(name + ".bias", h)
            return get(name + ".gamma", h), get(name + ".beta", h)  # pre-2019 checkpoints

        self.word = get("embeddings.word_embeddings.weight", c.vocab_size, h)
        self.position = get("embeddings.position_embeddings.weight", c.max_positions, h)
        types = get("embeddings.token_type_embeddings.weight", c.type_vocab_size, h)
        # Single-segment input: every token has type 0, so its row is added once.
        self.type0 = types[0]
        # Pairs: each token's own type's row, its type split from its id on the device.
        self.types = types if token_types else None
        self.embed_norm = layer_norm("embeddings.LayerNorm")
        self.layers: list[_Layer] = []
        for i in range(c.layers):
            p = f"encoder.layer.{i}."
            qkv = [p + f"attention.self.{n}" for n in ("query", "key", "value")]
            self.layers.append(
                _Layer(
                    qkv_w=torch.cat([get(n + ".weight", h, h) for n in qkv]),
                    qkv_b=torch.cat([get(n + ".bias", h) for n in qkv]),
                    out_w=get(p + "attention.output.dense.weight", h, h),
                    out_b=get(p + "attention.output.dense.bias", h),
                    norm1=layer_norm(p + "attention.output.LayerNorm"),
                    up_w=get(p + "intermediate.dense.weight", inter, h),
                    up_b=get(p + "intermediate.dense.bias", inter),
                    down_w=get(p + "output.dense.weight", h, inter),
                    down_b=get(p + "output.dense.bias", h),
                    norm2=layer_norm(p + "output.LayerNorm"),
                )
            )
        self.attention = choose_attention(device, dtype)
        self.ops = fused_ops(device, dtype)
        # On a GPU in half precision the GELU runs in the up projection's GEMM epilogue
        # (cuBLASLt, tanh form): one pass over the (T, I) activations instead of three.
        half = device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
        self.fused_gelu = half and c.activation != "relu"
        self.act: Callable[[torch.Tensor], torch.Tensor]
        if c.activation == "gelu":
            self.act = F.gelu  # exact (erf), as BERT was trained
        elif c.activation == "relu":
            self.act = F.relu
        else:
            self.act = partial(F.gelu, approximate="tanh")
        self.scale = 1.0 / math.sqrt(h // c.heads)

    def forward(self, batch: PackedBatch, pooled: torch.Tensor | None = None) -> torch.Tensor:
        import torch.nn.functional as F

        c = self.config
        tokens = batch.input_ids.shape[0]
        heads, head_dim = c.heads, c.hidden // c.heads
        positions = (
            batch.positions.long() + c.position_offset if c.position_offset else batch.positions
        )
        if self.types is None:
            x = self.word[batch.input_ids] + self.position[positions] + self.type0  # (T, H)
        else:
            ids, types = split_types(batch.input_ids)
            x = self.word[ids] + self.position[positions] + self.types[types]
        x = F.layer_norm(x, (c.hidden,), *self.embed_norm, c.eps)
        last = self.layers[-1]
        for layer in self.layers:
            qkv = F.linear(x, layer.qkv_w, layer.qkv_b).view(tokens, 3, heads, head_dim)
            q, k, v = qkv.unbind(1)  # each (T, nh, hd)
            rows_only = pooled is not None and layer is last
            if rows_only:  # from here on, the pooled rows only
                q, x = q[pooled], x[pooled]
            a = self.attention(q, k, v, batch, False, self.scale, rows_only)
            a = a.reshape(-1, c.hidden)
            x = self.ops.add_layer_norm(
                F.linear(a, layer.out_w, layer.out_b), x, *layer.norm1, c.eps
            )
            down = F.linear(self._up(layer, x), layer.down_w, layer.down_b)
            x = self.ops.add_layer_norm(down, x, *layer.norm2, c.eps)
        return x

    def _up(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        """The up projection and its activation: (T, H) -> (T, I)."""
        import torch
        import torch.nn.functional as F

        if self.fused_gelu:
            return torch._addmm_activation(layer.up_b, x, layer.up_w.t(), use_gelu=True)
        return self.act(F.linear(x, layer.up_w, layer.up_b))

    def warm_matmuls(self, rows: int) -> None:
        """One layer's projections for `rows` token rows, called as `forward` calls them:
        every matrix shape a batch of that many rows meets, at a layer's cost (see
        ReplicaModel.matmuls)."""
        import torch
        import torch.nn.functional as F

        layer = self.layers[0]
        with torch.inference_mode():
            x = torch.zeros(
                rows, self.config.hidden, dtype=self.word.dtype, device=self.word.device
            )
            F.linear(x, layer.qkv_w, layer.qkv_b)
            F.linear(x, layer.out_w, layer.out_b)
            F.linear(self._up(layer, x), layer.down_w, layer.down_b)
