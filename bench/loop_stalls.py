"""How long a tokenizer call keeps the event loop from running, by the way it is called.

    RAYON_NUM_THREADS=1 TOKIO_WORKER_THREADS=1 python bench/loop_stalls.py [--texts 1024 4096]

On uvloop, a task that sleeps 1 ms at a time notes every wake-up later than 3 ms: the loop's
thread was waiting for the interpreter lock (or for a core). Each case awaits --calls calls
over the same texts, either through `tokenizers`' own `async_encode_batch_fast` (what the
engine used before its tokenizer got a thread of its own) or `encode_batch_fast` in a worker
thread (`asyncio.to_thread`). With one tokenizer thread on a machine of two cores or more,
the loop's thread has a core of its own, so what stalls it is the lock. JSON out: per case,
the median call and the stalls.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from common import environment, fast_tokenizer, load_corpus, write_json
from throughput import minilm_directory

TICK_S = 0.001
STALL_S = 0.003


async def ticker(stalls: list[float], stop: asyncio.Event) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(TICK_S)
        now = time.perf_counter()
        if now - last > STALL_S:
            stalls.append(now - last)
        last = now


async def case(tokenizer: Any, texts: list[str], path: str, calls: int) -> dict[str, Any]:
    stalls: list[float] = []
    stop = asyncio.Event()
    ticking = asyncio.create_task(ticker(stalls, stop))
    await asyncio.sleep(0.01)
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        if path == "async_encode_batch_fast":
            await tokenizer.async_encode_batch_fast(texts)
        else:
            await asyncio.to_thread(tokenizer.encode_batch_fast, texts)
        seconds.append(time.perf_counter() - started)
    stop.set()
    await ticking
    return {
        "call_p50_ms": round(1000 * statistics.median(seconds), 1),
        "stalls_per_call": round(len(stalls) / calls, 1),
        "stalled_ms_per_call": round(1000 * sum(stalls) / calls, 1),
        "longest_stall_ms": round(1000 * max(stalls, default=0.0), 1),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tokenizer = fast_tokenizer(minilm_directory(), 256)
    corpus = load_corpus(repeat=1)
    await tokenizer.async_encode_batch_fast(corpus[:16])  # the tokenizer's threads start
    cases: dict[str, Any] = {}
    for count in args.texts:
        for path in ("async_encode_batch_fast", "encode_batch_fast in a thread"):
            label = f"{count} texts, {path}"
            cases[label] = await case(tokenizer, corpus[:count], path, args.calls)
            print(label, cases[label], flush=True)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out")
    args = parser.parse_args()
    import uvloop

    cases = uvloop.run(run(args))
    threads = {name: os.environ.get(name) for name in ("RAYON_NUM_THREADS", "TOKIO_WORKER_THREADS")}
    result = {
        "benchmark": "loop_stalls",
        "calls": args.calls,
        "thread_settings": threads,
        "cases": cases,
        "environment": environment(),
    }
    write_json(result, args.out)


if __name__ == "__main__":
    main()
