"""Host time of each step of launching a batch while the device is still busy: every step
should take microseconds to milliseconds, never the busy kernel's second.

    python bench/launch_latency.py
"""

from __future__ import annotations

import asyncio
import itertools
import time

import numpy as np
import torch
from throughput import minilm_directory

from embedx.config import load_settings
from embedx.devices import discover, open_accelerator
from embedx.engine import Engine, EngineOptions
from embedx.models.catalog import ModelSpec
from embedx.models.packing import to_device
from embedx.models.pooling import Pooling
from embedx.models.source import resolve


async def main() -> None:
    directory = minilm_directory()
    spec = ModelSpec(name="minilm", source=str(directory), pooling=Pooling.MEAN, max_seq_len=256)
    accelerators = [open_accelerator(d) for d in discover(load_settings({"devices": "0"}))]
    engine = await Engine.load(spec, resolve(str(directory)), accelerators, EngineOptions())
    replica = engine.replicas[0]
    stream = replica.accelerator.stream  # type: ignore[attr-defined]
    ids = [np.arange(1000, 1040, dtype=np.int32) for _ in range(300)]
    for slot in (0, 1):
        host = replica.pack(ids, slot)
        print("pinned input", host.pinned is not None and host.pinned.is_pinned())
        with torch.cuda.stream(stream):
            torch.cuda._sleep(2_000_000_000)  # about a second of a busy stream
            marks = [time.perf_counter()]
            batch = to_device(host, replica.accelerator.device)
            marks.append(time.perf_counter())
            vectors = replica.model.forward(batch)
            marks.append(time.perf_counter())
            out = replica.staging[slot].output(*vectors.shape)
            print("pinned output", out.is_pinned())
            marks.append(time.perf_counter())
            out.copy_(vectors, non_blocking=True)
            marks.append(time.perf_counter())
        steps = ("to_device", "forward", "staging", "copy")
        took = [round((b - a) * 1000, 2) for a, b in itertools.pairwise(marks)]
        print(dict(zip(steps, took, strict=True)), "ms")
        torch.cuda.synchronize()
    await engine.close()


asyncio.run(main())
