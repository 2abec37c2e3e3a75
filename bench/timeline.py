"""What the host does while the devices run: a timeline of one `embed` call over the corpus.

    python bench/timeline.py MODEL --devices 0,1 [--max-batch-tokens N] [--out FILE]

MODEL as in throughput.py. After a warm-up pass, one timed pass records every chunk the
tokenizer queues, every claim (its size, the queue's length then, whether texts were still
being tokenized, and the size the end game asked for), how long each launch held the event
loop, each batch's device time, and every stall of the event loop over 2 ms. JSON out: the
per-device summary, then the events themselves. It wraps the queue's and accelerators'
methods on the instances, and the policy's tail target, for this diagnosis only; the engine
is the real one.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import DEFAULT_CORPUS, environment, load_corpus, open_engine, write_json
from throughput import model_directory

from embedx.scheduling import DeviceView, End, QueueView, policy

LAG_STEP_S = 0.001
LAG_REPORTED_S = 0.002


class Recorder:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.events: list[dict[str, Any]] = []
        self.on = False

    def now(self) -> float:
        return round(time.perf_counter() - self.t0, 5)

    def add(self, kind: str, **fields: Any) -> None:
        if self.on:
            self.events.append({"t": self.now(), "kind": kind, **fields})


def instrument(engine: Any, record: Recorder) -> None:
    queue = engine.queue
    submit, claim, complete, tail = queue.submit, queue.claim, queue.complete, policy.tail_target
    asked: dict[str, int | None] = {}

    def traced_submit(job: Any, items: Any) -> None:
        submit(job, items)
        record.add("queued", tokens=sum(i.length for i in items), pending=queue.pending_tokens)

    def traced_tail(view: QueueView, me: DeviceView, end: End) -> int | None:
        target = tail(view, me, end)
        asked[me.name] = target
        return target

    def traced_claim(device: Any) -> Any:
        pending, feeding = queue.pending_tokens, queue.feeding
        asked.pop(device.name, None)
        got = claim(device)
        if got is not None:
            record.add(
                "claim",
                device=device.name,
                tokens=got.tokens,
                texts=len(got.items),
                pending=pending,
                feeding=feeding,
                asked=asked.get(device.name),
                expected_s=round(got.expected_s, 5),
                budget=device.budget,
                inflight=len(device.inflight),
            )
        return got

    def traced_complete(got: Any, seconds: float | None = None) -> Any:
        record.add("done", device=got.device.name, tokens=got.tokens, device_s=seconds)
        return complete(got, seconds)

    queue.submit, queue.claim, queue.complete = traced_submit, traced_claim, traced_complete
    policy.tail_target = traced_tail  # the queue calls it through the module
    for worker in engine.workers:
        accelerator = worker.replica.accelerator
        launch, name = accelerator.launch, worker.slot.name

        def traced_launch(work: Any, launch: Any = launch, name: str = name) -> Any:
            started = time.perf_counter()
            launched = launch(work)
            record.add("launch", device=name, host_s=round(time.perf_counter() - started, 6))
            return launched

        accelerator.launch = traced_launch


async def watch_loop(record: Recorder) -> None:
    """Sleep LAG_STEP_S at a time; whatever kept the loop longer is a stall."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(LAG_STEP_S)
        late = time.perf_counter() - before - LAG_STEP_S
        if late > LAG_REPORTED_S:
            record.add("stall", seconds=round(late, 5))


def summarize(events: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_kind.setdefault(event["kind"], []).append(event)
    queued = by_kind.get("queued", [])
    stalls = [e["seconds"] for e in by_kind.get("stall", [])]
    syncs = by_kind.get("sync", [])
    devices: dict[str, Any] = {}
    for name in sorted({e["device"] for e in by_kind.get("claim", [])}):
        claims = [e for e in by_kind["claim"] if e["device"] == name]
        launches = [e["host_s"] for e in by_kind.get("launch", []) if e["device"] == name]
        done = [e for e in by_kind.get("done", []) if e["device"] == name]
        sizes = [e["tokens"] for e in claims]
        devices[name] = {
            "batches": len(claims),
            "tokens": sum(sizes),
            "median_batch_tokens": statistics.median(sizes),
            "claims_while_feeding": sum(1 for e in claims if e["feeding"]),
            "claims_cut_by_end_game": sum(
                1 for e in claims if e["asked"] is not None and e["asked"] < e["budget"]
            ),
            "claims_short_of_queue": sum(1 for e in claims if e["pending"] < e["budget"]),
            "second_slot_claims": sum(1 for e in claims if e["inflight"] > 1),
            "device_busy_s": round(sum(e["device_s"] or 0 for e in done), 4),
            "launch_host_s": round(sum(launches), 4),
            "launch_host_max_s": max(launches, default=0.0),
            "last_done_at_s": max((e["t"] for e in done), default=None),
        }
    return {
        "seconds": seconds,
        "all_queued_at_s": queued[-1]["t"] if queued else None,
        "chunks_queued": len(queued),
        "loop_stalls_over_2ms": len(stalls),
        "loop_stalled_s": round(sum(stalls), 4),
        "longest_stall_s": max(stalls, default=0.0),
        "syncs": len(syncs),
        "sync_sites": sorted({" | ".join(e["stack"][-2:]) for e in syncs})[:10],
        "devices": devices,
    }


def report_syncs(record: Recorder) -> None:
    """Have torch warn at every operation that makes the host wait for a GPU, and record
    where each one was called from."""
    import traceback
    import warnings

    import torch

    torch.cuda.set_sync_debug_mode("warn")
    warnings.simplefilter("always")

    def show(message: Any, *args: Any, **kwargs: Any) -> None:
        stack = traceback.format_stack(limit=8)[:-2]
        record.add("sync", message=str(message)[:200], stack=[line.strip() for line in stack])

    warnings.showwarning = show


async def measure(args: argparse.Namespace, directory: Path, pooling: str, length: int) -> Any:
    texts = load_corpus(args.corpus, args.repeat)
    engine = await open_engine(directory, pooling, length, args.devices, args.max_batch_tokens)
    record = Recorder()
    instrument(engine, record)
    if args.sync_debug:
        report_syncs(record)
    watcher = asyncio.create_task(watch_loop(record))
    try:
        await engine.embed(texts)  # warm-up
        runs = []
        for _ in range(args.runs):
            record.events.clear()
            record.t0 = time.perf_counter()
            record.on = True
            await engine.embed(texts)
            seconds = time.perf_counter() - record.t0
            record.on = False
            runs.append({"summary": summarize(record.events, seconds), "events": record.events[:]})
    finally:
        watcher.cancel()
        await engine.close()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--devices", required=True)
    parser.add_argument("--corpus", nargs="+", default=list(DEFAULT_CORPUS))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-batch-tokens", type=int, default=262144)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--events", action="store_true", help="keep every event in the JSON")
    parser.add_argument("--sync-debug", action="store_true", help="record every host-GPU sync")
    parser.add_argument("--out")
    args = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as workdir:
        directory, pooling, length = model_directory(args.model, Path(workdir), False, device)
        runs = asyncio.run(measure(args, directory, pooling, length))
    if not args.events:
        for run in runs:
            del run["events"]
    result = {
        "benchmark": "timeline",
        "model": args.model,
        "devices": args.devices,
        "max_batch_tokens": args.max_batch_tokens,
        "runs": runs,
        "environment": environment(),
    }
    write_json(result, args.out)


if __name__ == "__main__":
    main()
