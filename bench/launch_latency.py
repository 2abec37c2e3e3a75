"""Host time of each step of launching a batch while the device is still busy: every step
should take microseconds to milliseconds, never the time the device needs to run it.

    python bench/launch_latency.py [MODEL] [--batches 12] [--out FILE]

MODEL as in throughput.py (default minilm). Real texts are tokenized, sorted by length and
cut into batches of several sizes and widths, as the queue cuts them; each is launched on
a stream kept busy by a sleeping kernel, timing to_device, forward, staging and the copy
out. The slowest launch is run again under torch.profiler: its host-side operators, by
time, say which one waited.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    DEFAULT_CORPUS,
    environment,
    fast_tokenizer,
    load_corpus,
    open_engine,
    write_json,
)
from throughput import model_directory

BUSY_CYCLES = 200_000_000  # about 0.1 s of a busy stream on an H200


def real_batches(directory: Path, length: int, count: int, budget: int) -> list[list[np.ndarray]]:
    """Contiguous runs of the length-sorted corpus, of random sizes within the budget."""
    tokenizer = fast_tokenizer(directory, length)
    texts = load_corpus(DEFAULT_CORPUS, 1)
    ids = sorted((np.asarray(e.ids, np.int32) for e in tokenizer.encode_batch_fast(texts)), key=len)
    rng = random.Random(0)
    batches = []
    for _ in range(count):
        start = rng.randrange(len(ids) - 1)
        target = rng.choice((budget // 16, budget // 4, budget // 2, budget))
        stop, tokens = start, 0
        while stop < len(ids) and tokens + len(ids[stop]) <= target:
            tokens += len(ids[stop])
            stop += 1
        batches.append(ids[start : max(stop, start + 1)])
    return batches


def launch_steps(replica: Any, host: Any, slot: int) -> dict[str, float]:
    """Launch one batch behind a sleeping kernel; host milliseconds of each step."""
    import torch

    from embedx.models.packing import to_device

    stream = replica.accelerator.stream
    with torch.cuda.device(replica.accelerator.device), torch.cuda.stream(stream):
        torch.cuda._sleep(BUSY_CYCLES)  # type: ignore[no-untyped-call]
        marks = [time.perf_counter()]
        batch = to_device(host, replica.accelerator.device)
        marks.append(time.perf_counter())
        vectors = replica.model.forward(batch)
        marks.append(time.perf_counter())
        out = replica.staging[slot].output(len(vectors), vectors.shape[1], vectors.dtype)
        marks.append(time.perf_counter())
        out.copy_(vectors, non_blocking=True)
        marks.append(time.perf_counter())
        started = time.perf_counter()
        stream.synchronize()
        device_ms = (time.perf_counter() - started) * 1000
    steps = ("to_device", "forward", "staging", "copy")
    took = {
        s: round((b - a) * 1000, 3)
        for s, (a, b) in zip(steps, itertools.pairwise(marks), strict=True)
    }
    return {**took, "then_waited_ms": round(device_ms, 2), "pinned_out": out.is_pinned()}


def profiled(replica: Any, host: Any) -> str:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, with_stack=True) as prof:
        launch_steps(replica, host, 0)
    averages = prof.key_averages()
    by_stack = prof.key_averages(group_by_stack_n=8)
    return "\n".join(
        (
            str(averages.table(sort_by="cpu_time_total", row_limit=15)),
            str(
                by_stack.table(sort_by="self_cpu_time_total", row_limit=2, max_name_column_width=60)
            ),
        )
    )


async def measure(args: argparse.Namespace, directory: Path, pooling: str, length: int) -> Any:
    engine = await open_engine(directory, pooling, length, "0", args.max_batch_tokens)
    replica = engine.replicas[0]
    try:
        budget = engine.workers[0].slot.budget
        batches = real_batches(directory, length, args.batches, budget)
        rows = []
        for i, ids in enumerate(batches):
            host = replica.pack(ids, i % 2, budget)
            steps = launch_steps(replica, host, i % 2)
            lengths = [len(x) for x in ids]
            shape = {"texts": len(ids), "tokens": sum(lengths), "longest": max(lengths)}
            rows.append({**shape, **steps})
        worst = max(range(len(rows)), key=lambda i: rows[i]["forward"] + rows[i]["copy"])
        table = profiled(replica, replica.pack(batches[worst], 0, budget))
    finally:
        await engine.close()
    return rows, worst, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="minilm")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--max-batch-tokens", type=int, default=262144)
    parser.add_argument("--out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        directory, pooling, length = model_directory(args.model, Path(workdir), False, "cuda")
        rows, worst, table = asyncio.run(measure(args, directory, pooling, length))
    print(table)
    result = {
        "benchmark": "launch_latency",
        "model": args.model,
        "launches": rows,
        "profiled": worst,
        "profile": table.splitlines(),
        "environment": environment(),
    }
    write_json(result, args.out)


if __name__ == "__main__":
    main()
