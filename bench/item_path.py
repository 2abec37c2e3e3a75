"""What the event loop spends on each text between its tokenizer chunk and its finished
batch: the real queue, packing and delivery, no device and no HTTP.

    python bench/item_path.py [--requests 64] [--texts 256] [--rounds 20] [--out FILE]

Each round queues --requests requests of --texts texts (the default corpus through MiniLM's
tokenizer, cut at 256 tokens) as the engine does (`chunk_items`), then claims batches of one
device's --budget tokens, packs them, writes their rows as `DeviceWorker` does
(`write_batch`) and completes them. Batches mix requests, as a busy server's do. JSON:
microseconds a text for each step, the median over rounds. On the H200 host the server's
loop thread spends 10 to 15 us a text in all (bench/results/h200x2-run13/).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from common import environment, load_corpus, write_json
from throughput import minilm_directory

from embedx.engine import _sole_job, chunk_items, write_batch
from embedx.models.packing import pack
from embedx.models.source import resolve
from embedx.models.tokenizer import Encoded, TextTokenizer
from embedx.scheduling import FLOATS, ConvergingQueue, Job

DIMENSIONS = 384  # MiniLM's rows


def one_round(queue: ConvergingQueue, chunks: list[Encoded], slot: Any) -> dict[str, float]:
    clocks = dict.fromkeys(("queue", "claim", "pack", "deliver"), 0.0)
    started = time.perf_counter()
    for encoded in chunks:
        job = Job(len(encoded.lengths))
        job.out = np.empty((job.size, DIMENSIONS), np.float32)
        queue.feeding_started(job)
        queue.submit(job, chunk_items(job, 0, encoded))
        queue.feeding_done(job)
    clocks["queue"] = time.perf_counter() - started
    while queue.pending_items:
        started = time.perf_counter()
        claim = queue.claim(slot)
        assert claim is not None
        claimed = time.perf_counter()
        host = pack([item.ids for item in claim.items])
        packed = time.perf_counter()
        rows = np.zeros((host.count, DIMENSIONS), np.float32)
        write_batch(claim.items, _sole_job(claim.items), rows, FLOATS)
        queue.complete(claim, 0.01)
        done = time.perf_counter()
        clocks["claim"] += claimed - started
        clocks["pack"] += packed - claimed
        clocks["deliver"] += done - packed
    return clocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--texts", type=int, default=256, help="texts a request")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--budget", type=int, default=131072, help="a batch's tokens")
    parser.add_argument("--out")
    args = parser.parse_args()
    tokenizer = TextTokenizer(resolve(str(minilm_directory())), 256)
    texts = load_corpus()[: args.requests * args.texts]
    chunks = [
        tokenizer.encode_now(texts[i : i + args.texts]) for i in range(0, len(texts), args.texts)
    ]
    queue = ConvergingQueue(max_batch_items=32768)
    slot = queue.add_device(
        "device", budget=args.budget, rate=1e7, max_inflight=2,
        probe=[(1000.0, 0.001), (100000.0, 0.01)], launch_s=0.001, shares_host=False,
    )  # fmt: skip
    rounds = [one_round(queue, chunks, slot) for _ in range(args.rounds)]
    count = len(texts)
    steps = {
        step: round(1e6 * statistics.median(r[step] for r in rounds) / count, 3)
        for step in rounds[0]
    }
    result = {
        "benchmark": "item_path",
        "texts_a_round": count,
        "texts_a_request": args.texts,
        "budget_tokens": args.budget,
        "rounds": args.rounds,
        "us_per_text": {**steps, "all": round(sum(steps.values()), 3)},
        "environment": environment(),
    }
    write_json(result, args.out)


if __name__ == "__main__":
    main()
