"""What the engine's output is held to: a model's float32 forward on the CPU, packed as one
batch, and base64 rows decoded back to floats."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np


def forward(
    directory: Path, pooling: str, implementation: str, texts: list[str], bucketed: bool = False
) -> np.ndarray:
    """The model's (N, D) rows for `texts` (cut at 64 tokens), from `implementation`'s forward
    on the CPU in float32; `bucketed`: with the padded token rows CUDA pools."""
    import torch

    from embedx.models.loader import EmbeddingModel
    from embedx.models.packing import pack, to_device
    from embedx.models.pooling import Pooling
    from embedx.models.source import resolve
    from embedx.models.tokenizer import TextTokenizer

    cpu = torch.device("cpu")
    files = resolve(str(directory))
    ids = TextTokenizer(files, 64).encode_now(texts).views()
    model = EmbeddingModel(files, Pooling(pooling), cpu, "float32", implementation)
    model.bucket_pooled_rows = bucketed
    return model.forward(to_device(pack(ids, budget=16384 if bucketed else None), cpu)).numpy()


def decoded(rows: np.ndarray) -> np.ndarray:
    """(N, L) uint8 base64 rows back to (N, D) float32."""
    return np.stack([np.frombuffer(base64.b64decode(row.tobytes()), "<f4") for row in rows])
