"""A model on one device: picks the architecture's code, loads the weights, adds pooling and the
sentence-transformers Dense layers, and exposes one call: packed batch in, vectors out."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from embedx.errors import InvalidModel, NativeCodeLacks
from embedx.models import bert, qwen3
from embedx.models.pooling import Pooling, bucketed, pool, pooled_rows
from embedx.models.source import ModelFiles

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from embedx.devices import DeviceInfo
    from embedx.models.packing import PackedBatch
    from embedx.models.splade import SpladeModel
    from embedx.models.task import ModelTask

log = logging.getLogger("embedx.loader")

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def apply(x: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        if name == "Identity":
            return x
        result: torch.Tensor = getattr(F, name.lower())(x)
        return result

    return apply


# sentence-transformers Dense activations, by their torch.nn class name
ACTIVATIONS = {name: _activation(name) for name in ("Identity", "Tanh", "ReLU", "GELU", "Sigmoid")}


class Encoder(Protocol):
    causal: bool

    def forward(self, batch: PackedBatch, pooled: torch.Tensor | None = None) -> torch.Tensor:
        """(T, H) final token states; with `pooled` ((B,) rows), only those rows' (B, H)."""
        ...


def torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype: torch.dtype = getattr(torch, name)
    return dtype


def resolve_dtype(requested: str, *, cuda: bool, bf16: bool) -> str:
    """auto: bfloat16 on GPUs that have it, float16 on older GPUs, float32 on the CPU."""
    if requested != "auto":
        return requested
    if not cuda:
        return "float32"
    return "bfloat16" if bf16 else "float16"


def dtype_on(requested: str, device: DeviceInfo) -> str:
    """The dtype a model's weights take on `device` (`resolve_dtype`; every CPU computes in
    float32 and bfloat16)."""
    return resolve_dtype(
        requested, cuda=device.is_cuda, bf16=device.supports_bf16 or not device.is_cuda
    )


NativeConfig = bert.BertConfig | qwen3.Qwen3Config


def native_config(files: ModelFiles) -> NativeConfig | None:
    """embedx's own code's reading of the checkpoint's config, for the model types it has code
    for; NativeCodeLacks names a feature of this checkpoint that code lacks."""
    model_type = files.config.get("model_type")
    if model_type in bert.MODEL_TYPES:
        return bert.BertConfig.from_json(files.config)
    if model_type in qwen3.MODEL_TYPES:
        return qwen3.Qwen3Config.from_json(files.config)
    return None


def chosen_config(files: ModelFiles, implementation: str) -> NativeConfig | None:
    """The native config the model runs on, or None for transformers: `auto` takes embedx's
    own code where it reads the whole config and leaves the rest (a Qwen3 with sliding-window
    attention, say) to transformers; `native` refuses a model its code cannot run."""
    if implementation == "transformers":
        return None
    try:
        config = native_config(files)
    except NativeCodeLacks as exc:
        if implementation == "native":
            raise
        log.info("embedx's own code does not fit (%s): transformers runs this model", exc)
        return None
    if config is None and implementation == "native":
        raise InvalidModel(
            f"embedx has no native code for model_type {files.config.get('model_type')!r}"
        )
    return config


def max_tokens(files: ModelFiles, implementation: str = "auto") -> int:
    """The longest input the model's position table allows."""
    native = chosen_config(files, implementation)
    if native is not None:
        return native.max_tokens
    config = files.config
    limit = int(config.get("max_position_embeddings") or config.get("n_positions") or 512)
    if config.get("model_type") in bert.MODEL_TYPES:
        limit -= bert.position_offset(config)
    return limit


def weight_bytes(files: ModelFiles, dtype: str) -> int:
    """The weights' size on the device, from the files' sizes and the dtype they are saved in."""
    stored = DTYPE_BYTES.get(str(files.config.get("torch_dtype") or files.config.get("dtype")), 4)
    on_disk = sum(path.stat().st_size for path in files.weights)
    return on_disk * DTYPE_BYTES[dtype] // stored


@dataclass(slots=True)
class _Dense:
    weight: torch.Tensor
    bias: torch.Tensor | None
    activation: str


class EmbeddingModel:
    """One replica: encoder, pooling and Dense layers on one device."""

    def __init__(
        self,
        files: ModelFiles,
        pooling: Pooling,
        device: torch.device,
        dtype: str,
        implementation: str = "auto",
    ) -> None:

        self.device = device
        self.dtype = dtype
        self.pooling = pooling
        self.normalizes = files.normalizes
        target = torch_dtype(dtype)
        native = chosen_config(files, implementation)
        self.encoder: Encoder
        self.matmuls: Callable[[int], None] | None = None  # see ReplicaModel
        if isinstance(native, bert.BertConfig):
            native_encoder = bert.BertEncoder(native, list(files.weights), device, target)
            self.encoder, self.matmuls = native_encoder, native_encoder.warm_matmuls
            self.implementation, hidden = "bert", native.hidden
        elif isinstance(native, qwen3.Qwen3Config):
            decoder = qwen3.Qwen3Encoder(native, list(files.weights), device, target)
            self.encoder, self.matmuls = decoder, decoder.warm_matmuls
            self.implementation, hidden = "qwen3", native.hidden
        else:
            from embedx.models.transformers_auto import TransformersEncoder

            encoder = TransformersEncoder(files, device, target)
            self.encoder = encoder
            self.implementation, hidden = "transformers", encoder.hidden_size
        # A CLS or last token sees its whole text (a causal model's first token does not), so
        # its final state needs only its own row of the last layer.
        self.one_row_per_text = pooling is Pooling.LAST_TOKEN or (
            pooling is Pooling.CLS and not self.encoder.causal
        )
        self.bucket_pooled_rows = device.type == "cuda"  # see `bucketed`
        self.hidden = hidden  # the encoder's width, before any Dense layer
        self.dense = [self._load_dense(layer.weights, layer.activation) for layer in files.dense]
        self.dimensions = int(self.dense[-1].weight.shape[0]) if self.dense else hidden

    def _load_dense(self, path: Path, activation: str) -> _Dense:
        from safetensors.torch import load_file

        tensors = load_file(str(path), device=str(self.device))
        weight = tensors.get("linear.weight")
        if weight is None:  # named as modules.json does, not by where it lies
            raise InvalidModel(f"Dense module {path.parent.name} has no linear.weight")
        bias = tensors.get("linear.bias")
        if activation not in ACTIVATIONS:
            raise InvalidModel(f"Dense activation {activation} is not one of {sorted(ACTIVATIONS)}")
        return _Dense(weight.float(), None if bias is None else bias.float(), activation)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """(B, D) float32 vectors, before any normalization."""
        import torch
        import torch.nn.functional as F

        with torch.inference_mode():
            rows = pooled_rows(batch.cu_seqlens, self.pooling) if self.one_row_per_text else None
            if rows is not None:  # the last layer runs only for the pooled tokens
                if self.bucket_pooled_rows:
                    rows = bucketed(rows)
                vectors = self.encoder.forward(batch, rows)[: batch.count].float()
            else:
                t = batch.tokens
                hidden = self.encoder.forward(batch)[:t]  # (T, H): padding rows dropped
                vectors = pool(
                    hidden, batch.cu_seqlens, batch.segments[:t], batch.lengths, self.pooling
                )
            for layer in self.dense:
                vectors = ACTIVATIONS[layer.activation](F.linear(vectors, layer.weight, layer.bias))
            return vectors


def embedding_model(
    files: ModelFiles,
    task: ModelTask,
    pooling: Pooling,
    device: torch.device,
    dtype: str,
    implementation: str = "auto",
) -> EmbeddingModel | SpladeModel:
    """The replica an embedding task runs on: SPLADE's masked LM, an encoder with BGE-M3's
    heads, or an encoder alone."""
    if task.splade is not None:
        from embedx.models.splade import SpladeModel

        return SpladeModel(files, task.splade, device, dtype, implementation)
    if task.outputs != ("dense",):
        from embedx.models.m3 import M3Model

        return M3Model(files, pooling, device, dtype, implementation, task.unweighted)
    return EmbeddingModel(files, pooling, device, dtype, implementation)
