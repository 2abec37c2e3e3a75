"""Device time of one packed batch through each native encoder, under variants of its fast path.

    python bench/kernels.py [--tokens 65536] [--length 128] [--out FILE]

For each shape: the encoder as embedx loads it, the same with the GEMM-epilogue GELU off
(BERT), and the matrix products alone (the ceiling). Times are CUDA-event medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from common import environment, write_json


def timed(fn: Any, repeat: int = 10) -> float:
    """Median milliseconds of fn() on the current stream, after warm-up."""
    import torch

    for _ in range(3):
        fn()
    times: list[float] = []
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def matmul_ceiling(encoder: Any, tokens: int) -> float:
    """Milliseconds of just the layers' matrix products for `tokens` rows."""
    import torch

    weights = []
    for layer in encoder.layers:
        for name in ("qkv_w", "out_w", "up_w", "down_w", "o_w", "gate_up_w"):
            if hasattr(layer, name):
                weights.append(getattr(layer, name))
    inputs = {
        w.shape[1]: torch.randn(tokens, w.shape[1], device="cuda", dtype=w.dtype) for w in weights
    }

    def run() -> None:
        for w in weights:
            torch.matmul(inputs[w.shape[1]], w.t())

    return timed(run)


def measure(shape: str, workdir: Path, lengths: list[int], tokens: int) -> dict[str, Any]:
    import torch
    from throughput import minilm_directory

    from embedx.models.loader import EmbeddingModel
    from embedx.models.packing import pack, to_device
    from embedx.models.pooling import Pooling
    from embedx.models.random_init import build
    from embedx.models.source import resolve

    device = torch.device("cuda")
    directory = workdir / shape
    pooling = build(shape, directory, minilm_directory(), device="cuda")
    model = EmbeddingModel(resolve(str(directory)), Pooling(pooling), device, "bfloat16")
    encoder: Any = model.encoder
    rows: dict[str, Any] = {}
    for length in lengths:
        ids = np.arange(1000, 1000 + length, dtype=np.int32)
        host = pack([ids] * (tokens // length))
        batch = to_device(host, device)
        row = {"as_loaded": timed(lambda batch=batch: model.forward(batch))}
        if getattr(encoder, "fused_gelu", False):
            encoder.fused_gelu = False
            row["gelu_unfused"] = timed(lambda batch=batch: model.forward(batch))
            encoder.fused_gelu = True
        row["matmul_only"] = matmul_ceiling(encoder, host.tokens)
        row["tokens_per_s_as_loaded"] = host.tokens / row["as_loaded"] * 1000
        rows[f"length_{length}"] = row
        print(shape, length, {k: round(v, 2) for k, v in row.items()}, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--length", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--shapes", nargs="+", default=["bert-large", "bert-base", "qwen3-0.6b"])
    parser.add_argument("--out")
    args = parser.parse_args()
    import torch

    results: dict[str, Any] = {"benchmark": "kernels", "environment": environment(), "shapes": {}}
    with tempfile.TemporaryDirectory() as workdir:
        for shape in args.shapes:
            results["shapes"][shape] = measure(shape, Path(workdir), args.length, args.tokens)
            torch.cuda.empty_cache()
    write_json(results, args.out)


if __name__ == "__main__":
    main()
