"""What awaiting a short sleep costs on each event loop: why CUDA events are polled every 1 ms.

    python bench/poll_step.py [--seconds 1] [--out FILE]

For each loop (asyncio's own and uvloop) and each step, one task awaits
`asyncio.sleep(step)` over and over for --seconds: JSON out, the wake-ups a second, the
milliseconds between them and the CPU seconds the loop's thread used a second. uvloop
counts timers in whole milliseconds and rounds, so a step under half a millisecond returns
at once and the loop spins; asyncio's loop rounds up.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import uvloop
from common import environment, write_json

STEPS = (0.0005, 0.001, 0.002)


async def await_steps(step: float, seconds: float) -> dict[str, float]:
    started, cpu, wakeups = time.perf_counter(), time.thread_time(), 0
    while time.perf_counter() - started < seconds:
        await asyncio.sleep(step)
        wakeups += 1
    elapsed = time.perf_counter() - started
    return {
        "wakeups_per_s": round(wakeups / elapsed),
        "ms_between_wakeups": round(1e3 * elapsed / wakeups, 4),
        "cpu_s_per_s": round((time.thread_time() - cpu) / elapsed, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    loops: dict[str, Any] = {"asyncio": asyncio.run, "uvloop": uvloop.run}
    cases = {
        f"{name}, {step * 1e3:g} ms": run(await_steps(step, args.seconds))
        for name, run in loops.items()
        for step in STEPS
    }
    write_json({"benchmark": "poll_step", "cases": cases, "environment": environment()}, args.out)


if __name__ == "__main__":
    main()
