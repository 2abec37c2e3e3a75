"""A CPU process's resident memory as it embeds requests whose batches come in every shape.

    python bench/cpu_memory.py [--calls 240] [--texts 100] [--every 30] [--out FILE]

The library embeds --calls requests of --texts texts each, consecutive slices of the default
corpus through the real MiniLM on the CPU, so that every batch has a shape of its own, as a
server's do. JSON: the process's resident MB once the model is loaded and warm, then every
--every requests, the seconds a request took (median), and ONEDNN_PRIMITIVE_CACHE_CAPACITY
as the run had it: embedx sets 0 unless it is set; run once more with it at oneDNN's default
(`ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024 python bench/cpu_memory.py`) to see what that avoids.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import environment, load_corpus, write_json
from throughput import minilm_directory

from embedx import Embedder


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=240)
    parser.add_argument("--texts", type=int, default=100, help="texts a request")
    parser.add_argument("--every", type=int, default=30)
    parser.add_argument("--out")
    args = parser.parse_args()
    texts = load_corpus()
    requests = [texts[i * args.texts : (i + 1) * args.texts] for i in range(args.calls + 5)]
    resident: list[float] = []
    seconds: list[float] = []
    with Embedder(minilm_directory(), pooling="mean", devices="cpu") as embedder:
        for request in requests[args.calls :]:  # warm-up: kernels, allocator, first shapes
            embedder.embed(request)
        for call, request in enumerate(requests[: args.calls]):
            if call % args.every == 0:
                resident.append(resident_mb())
            started = time.perf_counter()
            embedder.embed(request)
            seconds.append(time.perf_counter() - started)
        resident.append(resident_mb())
    result = {
        "benchmark": "cpu_memory",
        "onednn_primitive_cache_capacity": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"),
        "calls": args.calls,
        "texts_a_call": args.texts,
        "resident_mb_every": args.every,
        "resident_mb": resident,
        "growth_mb": round(resident[-1] - resident[0], 1),
        "seconds_a_call_median": round(statistics.median(seconds), 4),
        "environment": environment(),
    }
    write_json(result, args.out)


if __name__ == "__main__":
    main()
