"""Does a GEMM of a shape cuBLAS has not met yet make the host wait for the device?

    python bench/gemm_shapes.py [--out FILE]

Behind a stream kept busy by a sleeping kernel, it times the host side of `F.linear`
(bf16, 1024 x 1024 weight, with bias) for row counts spread over three ranges, twice each:
a first call that takes the sleep's length waited for the stream. On an H200 with torch
2.11 and CUDA 13 most new row counts did, and a repeated one never did; this is why the
engine pads its pooled rows to a few bucketed counts and warms them when a model loads.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

from common import environment, write_json

RANGES = ((1000, 9000), (20000, 60000), (100000, 262144))
STEPS = 12
SLEEP_CYCLES = 100_000_000  # about 50 ms on an H200


def host_ms(stream: object, call: Callable[[], object]) -> float:
    import torch

    torch.cuda.synchronize()
    with torch.cuda.stream(stream):  # type: ignore[arg-type]
        torch.cuda._sleep(SLEEP_CYCLES)  # type: ignore[no-untyped-call]
        started = time.perf_counter()
        call()
        took = (time.perf_counter() - started) * 1000
    torch.cuda.synchronize()
    return took


def main() -> None:
    import torch
    import torch.nn.functional as F

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    weight = torch.randn(1024, 1024, device=device, dtype=torch.bfloat16)
    bias = torch.randn(1024, device=device, dtype=torch.bfloat16)
    sleep_ms = host_ms(stream, lambda: torch.cuda.synchronize())
    ranges = []
    with torch.inference_mode():
        for low, high in RANGES:
            calls = []
            for rows in range(low, high, (high - low) // STEPS):
                x = torch.randn(rows, 1024, device=device, dtype=torch.bfloat16)
                first = host_ms(stream, partial(F.linear, x, weight, bias))
                again = host_ms(stream, partial(F.linear, x, weight, bias))
                calls.append(
                    {"rows": rows, "first_ms": round(first, 2), "again_ms": round(again, 2)}
                )
            waited = sum(1 for c in calls if c["first_ms"] > sleep_ms / 2)
            ranges.append({"rows": [low, high], "first_calls_that_waited": waited, "calls": calls})
    write_json(
        {
            "benchmark": "gemm_shapes",
            "busy_stream_ms": round(sleep_ms, 2),
            "ranges": ranges,
            "environment": environment(),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
