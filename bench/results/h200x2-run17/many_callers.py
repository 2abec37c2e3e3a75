"""Scratch (h200x2-run17 `5-`, `6-`, `8-`): the engine's own cost of many requests, without HTTP.

The library as `load.py` measures it (one `embed` call over every text), against the same
engine and texts embedded as the server gets them: 64 callers in one event loop, each
embedding 256 texts at a time until none are left. Both in one process on cores 0-15, taking
turns, two timed passes each after a warm-up. From bench/, after the `load` stage's setup:
python3 results/h200x2-run17/many_callers.py OUT.json
"""

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

sys.path.insert(0, os.getcwd())
from common import DEFAULT_CORPUS
from load import MINILM, open_served_engine, repeated_texts

REQUESTS, BATCH, CALLERS = int(os.environ.get("REQUESTS", 800)), 256, 64


async def main() -> object:
    from embedx.engine import EmbedOptions

    os.sched_setaffinity(0, set(range(int(os.environ.get("LIBRARY_CORES", 16)))))
    texts = repeated_texts(list(DEFAULT_CORPUS), REQUESTS * BATCH)
    engine = await open_served_engine(MINILM, None, 262144)

    async def one_call() -> tuple[int, list[float]]:
        result = await engine.embed(texts)
        return result.tokens, [result.tokenize_s]

    def many_calls(callers: int, batch: int) -> Callable[[], Awaitable[tuple[int, list[float]]]]:
        async def run() -> tuple[int, list[float]]:
            batches = [texts[i : i + batch] for i in range(0, len(texts), batch)][::-1]
            tokens, tokenizing = 0, []

            async def caller() -> None:
                nonlocal tokens
                while batches:
                    result = await engine.embed(batches.pop(), EmbedOptions(base64=True))
                    tokens += result.tokens
                    tokenizing.append(result.tokenize_s)

            await asyncio.gather(*(caller() for _ in range(callers)))
            return tokens, tokenizing

        return run

    def counters() -> dict[str, float]:
        t, slot = engine.tokenizer, engine.workers[0].slot
        return {
            "busy": t.busy_s,
            "idle": t.idle_s,
            "free": t.free_s,
            "collect": t.collect_s,
            "calls": t.calls,
            "texts": t.texts,
            "batches": slot.batches_done,
            "tokens": slot.tokens_done,
            "gpu_busy": slot.busy_s,
            "launching": slot.launching_s,
        }

    import embedx.models.tokenizer as tokenizer_module

    capped = tokenizer_module.CALL_TEXTS
    modes = [
        (f"{name}, calls of {cap or 'any'} texts", run, cap)
        for name, run, cap in [
            ("one call", one_call, capped),
            ("64 callers x 256", many_calls(64, 256), capped),
            ("64 callers x 256", many_calls(64, 256), None),
            ("one call", one_call, None),
            ("64 callers x 256", many_calls(64, 256), capped),
            ("64 callers x 256", many_calls(64, 256), None),
            ("64 callers x 256", many_calls(64, 256), 1024),
            ("256 callers x 256", many_calls(256, 256), capped),
            ("one call", one_call, capped),
        ]
    ]
    results = []
    try:
        for mode, run, cap in modes:
            tokenizer_module.CALL_TEXTS = cap or 10**9
            await run()  # warm-up
            runs, cpu, before = [], time.thread_time(), counters()
            for _ in range(2):
                started = time.perf_counter()
                tokens, tokenizing = await run()
                runs.append(time.perf_counter() - started)
            cpu = time.thread_time() - cpu
            spent = {k: v - before[k] for k, v in counters().items()}
            wall = sum(runs)
            row = {
                "mode": mode,
                "tokens_per_s": round(tokens / statistics.median(runs)),
                "runs_s": [round(r, 3) for r in runs],
                "main_thread_us_per_text": round(1e6 * cpu / (2 * len(texts)), 2),
                "tokenizing_p50_s": round(statistics.median(tokenizing), 4),
                "tokenizer": {
                    k: round(spent[k] / wall, 3) for k in ("busy", "idle", "free", "collect")
                },
                "texts_per_call": round(spent["texts"] / max(1, spent["calls"])),
                "batches": spent["batches"],
                "tokens_per_batch": round(spent["tokens"] / max(1, spent["batches"])),
                "gpu_busy": round(spent["gpu_busy"] / wall, 3),
                "mean_launch_ms": round(1000 * spent["launching"] / max(1, spent["batches"]), 2),
                "launching": round(spent["launching"] / wall, 3),
            }
            print(row, flush=True)
            results.append(row)
    finally:
        await engine.close()
    return results


if __name__ == "__main__":
    import uvloop

    with open(sys.argv[1], "w") as f:
        json.dump(uvloop.run(main()), f, indent=1)
