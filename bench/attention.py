"""Which attention kernel runs packed (varlen) texts fastest: FlashAttention-2, cuDNN, or
memory-efficient, each through torch's own ops, on batches cut from the corpus's lengths.

    python bench/attention.py [--out FILE]      (needs a CUDA device)

Two head shapes: BERT-large (16 heads of 64, bidirectional) and Qwen3-0.6B (16 query and
8 key-value heads of 128, causal). Each kernel's output is checked against FlashAttention-2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
from common import environment, fast_tokenizer, load_corpus, write_json
from throughput import minilm_directory

SHAPES = {"bert-large": (16, 16, 64, False), "qwen3-0.6b": (16, 8, 128, True)}
BATCH_TOKENS = 65536

Kernel = Callable[..., Any]


def kernels() -> dict[str, Kernel]:
    import torch

    aten = torch.ops.aten

    def flash(q: Any, k: Any, v: Any, cu: Any, longest: int, causal: bool, scale: float) -> Any:
        return aten._flash_attention_forward(
            q, k, v, cu, cu, longest, longest, 0.0, causal, False, scale=scale
        )[0]

    def cudnn(q: Any, k: Any, v: Any, cu: Any, longest: int, causal: bool, scale: float) -> Any:
        return aten._cudnn_attention_forward(
            q, k, v, None, cu, cu, longest, longest, False, 0.0, causal, False, scale=scale
        )[0]

    def efficient(q: Any, k: Any, v: Any, cu: Any, longest: int, causal: bool, scale: float) -> Any:
        if k.shape[1] != q.shape[1]:  # no grouped heads: repeat them
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out = aten._efficient_attention_forward(
            q[None], k[None], v[None], None, cu, cu, longest, longest, 0.0, int(causal),
            scale=scale,
        )  # fmt: skip
        return out[0][0]

    return {"flash2": flash, "cudnn": cudnn, "efficient": efficient}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    import torch

    tokenizer = fast_tokenizer(minilm_directory(), 512)
    lengths = np.array([len(e) for e in tokenizer.encode_batch_fast(load_corpus())])
    rng = np.random.default_rng(0)
    rng.shuffle(lengths)
    cut = int(np.searchsorted(np.cumsum(lengths), BATCH_TOKENS))
    batch = lengths[:cut]  # a batch of texts as they come, ~65k tokens
    cu = torch.tensor(np.concatenate([[0], np.cumsum(batch)]), dtype=torch.int32, device="cuda")
    tokens, longest = int(batch.sum()), int(batch.max())
    result: dict[str, Any] = {
        "benchmark": "attention",
        "environment": environment(),
        "batch": {"texts": len(batch), "tokens": tokens, "longest": longest},
        "ms": {},
        "max_abs_diff_vs_flash2": {},
    }
    for shape, (heads, kv_heads, dim, causal) in SHAPES.items():
        q = torch.randn(tokens, heads, dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(tokens, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(tokens, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
        scale = dim**-0.5
        reference = None
        for name, kernel in kernels().items():
            key = f"{shape}/{name}"
            try:
                out = kernel(q, k, v, cu, longest, causal, scale)
                torch.cuda.synchronize()
            except Exception as exc:  # a kernel this build or GPU lacks
                result["ms"][key] = f"unavailable: {type(exc).__name__}: {str(exc)[:200]}"
                continue
            if reference is None:
                reference = out
            diff = (out.float() - reference.float()).abs().max().item()
            result["max_abs_diff_vs_flash2"][key] = diff
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            for _ in range(args.repeat):
                kernel(q, k, v, cu, longest, causal, scale)
            end.record()
            end.synchronize()
            result["ms"][key] = start.elapsed_time(end) / args.repeat
    write_json(result, args.out)


if __name__ == "__main__":
    main()
