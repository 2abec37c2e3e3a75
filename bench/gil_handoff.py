"""How long a tokenizer call waits for the interpreter lock while the event loop is busy.

    python bench/gil_handoff.py [--texts 10] [--calls 30] [--out FILE]

A small `async_encode_batch_fast` call (the tokenizer's threads hand its result back under
the lock) is timed on uvloop three ways: with the loop idle; with the loop busy in
callbacks of a set length, idle for the rest of the time; and the same while a task steps
aside once a millisecond with `time.sleep(0)`. A busy uvloop drops the lock only for an
instant between callbacks, so a waiting thread can wait until the loop runs out of work;
`os.sched_yield()` is timed as the other way of stepping aside. JSON out: p50 and p90
milliseconds of each case.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from common import environment, fast_tokenizer, load_corpus, write_json
from throughput import minilm_directory

LOADS = ((0.0002, 0.8), (0.001, 0.9), (0.003, 0.9))  # callback seconds, busy share
STEPS: dict[str, Callable[[], None] | None] = {
    "none": None,
    "time.sleep(0)": lambda: time.sleep(0),
    "os.sched_yield()": os.sched_yield,
}


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def busy_loop(stop: asyncio.Event, callback_s: float, share: float) -> None:
    """Callbacks of `callback_s`, each followed by an idle gap as long with 1 - `share` odds."""
    rng = random.Random(1)
    while not stop.is_set():
        spin(callback_s)
        await asyncio.sleep(callback_s if rng.random() < 1 - share else 0)


async def step_aside(stop: asyncio.Event, step: Callable[[], None]) -> None:
    while not stop.is_set():
        step()
        await asyncio.sleep(0.001)


async def measure(tokenizer: Any, texts: list[str], calls: int) -> dict[str, float]:
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        await tokenizer.async_encode_batch_fast(texts)
        seconds.append(time.perf_counter() - started)
        await asyncio.sleep(0.001)
    seconds.sort()
    return {
        "p50_ms": round(1000 * statistics.median(seconds), 2),
        "p90_ms": round(1000 * seconds[int(0.9 * (len(seconds) - 1))], 2),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tokenizer = fast_tokenizer(minilm_directory(), 256)
    texts = random.Random(0).sample(load_corpus(repeat=1), args.texts)
    await measure(tokenizer, texts, 5)  # warm-up: the tokenizer's threads start
    cases: dict[str, Any] = {"idle loop": await measure(tokenizer, texts, args.calls)}
    for callback_s, share in LOADS:
        for name, step in STEPS.items():
            stop = asyncio.Event()
            tasks = [asyncio.create_task(busy_loop(stop, callback_s, share))]
            if step is not None:
                tasks.append(asyncio.create_task(step_aside(stop, step)))
            label = f"{callback_s * 1000:g} ms callbacks, {share:.0%} busy, step aside: {name}"
            cases[label] = await measure(tokenizer, texts, args.calls)
            stop.set()
            await asyncio.gather(*tasks)
            print(label, cases[label], flush=True)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=10)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--out")
    args = parser.parse_args()
    import uvloop

    cases = uvloop.run(run(args))
    result = {
        "benchmark": "gil_handoff",
        "texts_per_call": args.texts,
        "calls": args.calls,
        "cases": cases,
        "environment": environment(),
    }
    write_json(result, args.out)


if __name__ == "__main__":
    main()
