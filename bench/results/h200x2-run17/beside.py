"""Scratch (h200x2-run17 `4-`): does load on the clients' cores slow the library on its own?

The library's rate, as `load.py` measures it (cores 0-15, 800 x 256 texts, two timed passes
after a warm-up), with cores 16-31 idle and then busy with 16 processes doing what the SDK
clients do with each response (base64 rows into Python floats), each busy BUSY of its time
(about 4.5 cores in all, as the clients used), taking turns. From bench/, after the `load`
stage's setup: python3 results/h200x2-run17/beside.py OUT.json
"""

import asyncio
import base64
import json
import multiprocessing
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.getcwd())
from common import load_corpus
from load import MINILM, library_rate

BUSY = 0.28
LIBRARY_CORES = set(range(int(os.environ.get("LIBRARY_CORES", 16))))
CLIENT_CORES = set(range(int(os.environ.get("CLIENT_CORES_FROM", 16)), os.cpu_count() or 1))
TEXTS = int(os.environ.get("TEXTS", 204800))


def burn(stop: "multiprocessing.synchronize.Event") -> None:
    os.sched_setaffinity(0, CLIENT_CORES)
    rows = np.random.default_rng(0).standard_normal((256, 384)).astype(np.float32)
    encoded = [base64.b64encode(row.tobytes()) for row in rows]
    while not stop.is_set():
        started = time.perf_counter()
        while time.perf_counter() - started < BUSY * 0.02:
            for row in encoded[:32]:
                np.frombuffer(base64.b64decode(row), np.float32).tolist()
        time.sleep((1 - BUSY) * 0.02)


def main() -> None:
    os.sched_setaffinity(0, LIBRARY_CORES)
    corpus = load_corpus()
    texts = (corpus * -(-TEXTS // len(corpus)))[:TEXTS]
    results = []
    for round_ in (1, 2):
        for busy in (False, True):
            stop = multiprocessing.Event()
            burners = [
                multiprocessing.Process(target=burn, args=(stop,)) for _ in range(16 if busy else 0)
            ]
            for p in burners:
                p.start()
            cpu, wall = os.times(), time.perf_counter()
            library = asyncio.run(library_rate(MINILM, None, texts, 262144, 2, None, []))
            stop.set()
            for p in burners:
                p.join()
            children = (
                os.times().children_user
                + os.times().children_system
                - cpu.children_user
                - cpu.children_system
            )
            row = {
                "round": round_,
                "clients_cores_busy": busy,
                "burners_cores": round(children / (time.perf_counter() - wall), 2),
                "tokens_per_s": round(library["tokens_per_s"]),
                "runs_s": library["runs_s"],
                "main_thread_us_per_text": library["main_thread_us_per_text"],
            }
            print(row, flush=True)
            results.append(row)
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
