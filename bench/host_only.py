"""The engine with devices that compute nothing: what the host alone costs an embed.

    python bench/host_only.py [--rounds 8] [--slow-rate 1e6] [--out FILE]

The real tokenizer, queue and workers embed the default corpus with MiniLM's tokenizer (256
cut); each fake device returns zero vectors at once, the second one after sleeping as long
as --slow-rate tokens/s says. So the host sets the pace, as it does for MiniLM on an H200.
Variants take turns, in reverse every other round: `one` (one fake device), `pair` (a slow
one beside it), both with the heap frozen as loading leaves it (`embedx.heap`), and
`one_thawed` (one device, `gc.unfreeze()` before each run: the cyclic garbage collector
scans everything, as before the engine froze the heap). JSON: each variant's median
seconds, when its last text was queued, its seconds in the collector per run, and its
round-by-round ratio to `one`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from common import GcClock, environment, load_corpus, paired_ratio, take_turns, write_json
from throughput import model_directory

from embedx.devices import CpuAccelerator, DeviceInfo
from embedx.engine import Engine, EngineOptions, Replica
from embedx.models.catalog import ModelSpec
from embedx.models.pooling import Pooling
from embedx.models.source import resolve

BUDGET = 262144  # tokens a batch, as the H200 runs use
DIMENSIONS = 384


def fake_devices(slow_rate: float) -> None:
    """Every replica's forward becomes zero vectors; the device keyed `slow` sleeps first."""

    def run(self: Replica, host: Any, slot: int, form: Any = None) -> torch.Tensor:
        if self.accelerator.info.key == "slow":
            time.sleep(host.tokens / slow_rate)  # off the event loop: a CPU device's thread
        return torch.zeros((host.count, DIMENSIONS))

    Replica.run = run  # type: ignore[method-assign]


def device(key: str) -> CpuAccelerator:
    return CpuAccelerator(DeviceInfo(key, "cpu", key, 1 << 34, 1 << 34, 2, None, 1.0))


async def measure(directory: Path, texts: list[str], rounds: int) -> dict[str, Any]:
    spec = ModelSpec(name="minilm", source=str(directory), pooling=Pooling.MEAN, max_seq_len=256)
    files = await asyncio.to_thread(resolve, spec.source)
    options = EngineOptions(
        max_batch_tokens=BUDGET,
        smoke_test=False,
        device_batch_tokens={"fast": BUDGET, "slow": BUDGET},
    )
    one = await Engine.load(spec, files, [device("fast")], options)
    pair = await Engine.load(spec, files, [device("fast"), device("slow")], options)
    clock = GcClock()

    async def run(engine: Engine, frozen: bool) -> tuple[float, float, float]:
        """One embed: its seconds, when its last text was queued, its seconds in the
        collector."""
        if frozen:
            gc.freeze()
        else:
            gc.unfreeze()
        in_gc = clock.seconds
        started = time.perf_counter()
        result = await engine.embed(texts)
        seconds = time.perf_counter() - started
        return seconds, result.tokenize_s, clock.seconds - in_gc

    variants = {"one": (one, True), "pair": (pair, True), "one_thawed": (one, False)}
    clock.start()
    try:
        for engine in (one, pair):
            await engine.embed(texts)  # warm-up
        runs = await take_turns({k: partial(run, *v) for k, v in variants.items()}, rounds)
    finally:
        clock.stop()
        await one.close()
        await pair.close()
    result: dict[str, Any] = {"rounds": rounds, "texts": len(texts)}
    for name, got in runs.items():
        result[name] = {
            "median_s": round(statistics.median(r[0] for r in got), 4),
            "tokenized_s": round(statistics.median(r[1] for r in got), 4),
            "gc_s": round(statistics.median(r[2] for r in got), 4),
            "vs_one_paired": round(
                paired_ratio([r[0] for r in got], [r[0] for r in runs["one"]]), 4
            ),
            "runs_s": [round(r[0], 4) for r in got],
        }
    result["pair"]["slow_device_tokens"] = pair.queue.devices[1].tokens_done
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--slow-rate", type=float, default=1e6, help="the slow device's tokens/s")
    parser.add_argument("--out")
    args = parser.parse_args()
    fake_devices(args.slow_rate)
    texts = load_corpus()
    with tempfile.TemporaryDirectory() as workdir:
        directory, _, _ = model_directory("minilm", Path(workdir), False, "cpu")
        result = asyncio.run(measure(directory, texts, args.rounds))
    result.update(benchmark="host_only", slow_rate=args.slow_rate, environment=environment())
    write_json(result, args.out)


if __name__ == "__main__":
    main()
