"""Mixed devices on real hardware: the converging queue against one device alone and static splits.

    python bench/mixed.py MODEL --devices 0,cpu [--static] [--out FILE]

MODEL as in throughput.py. Every policy embeds the same texts; makespan is the wall time of
one `embed` call (tokenization included); the fastest device alone and the converging queue
take turns, and each reports its median of --runs; `converging_vs_alone_paired` is the
median, round by round, of the converging queue's time over the fastest device's. For the
converging queue: each device's share of the tokens, how long it sat idle before the last
batch finished (its end idle), and when each run's last text was queued (`tokenized_s`).
With --control, a second engine on the fastest device alone takes turns too, and
`control_vs_alone_paired` says how far two identical engines differ in this process.
Static splits run one engine per device on a fixed share of the tokens (the longest texts
to the first, each part in the caller's order), concurrently: even, by static device score,
and the best ratio found by search in hindsight (two devices). They too take turns and
report their median of --runs: the best of single runs would be the luckiest run, not the
best ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from common import (
    CORPUS_HELP,
    DEFAULT_CORPUS,
    batch_size_change,
    batch_sizes,
    environment,
    fast_tokenizer,
    load_corpus,
    median_run,
    open_engine,
    paired_ratio,
    take_turns,
    write_json,
)
from throughput import model_directory


async def converging(engine: Any, texts: list[str]) -> dict[str, Any]:
    """One timed embed of every text, with each device's share, busy time and end idle."""
    before = {w.slot.name: (w.slot.tokens_done, w.slot.busy_s) for w in engine.workers}
    sizes_before = batch_sizes(engine)
    started = time.monotonic()
    result = await engine.embed(texts)
    ended = time.monotonic()
    devices = {}
    sizes = batch_size_change(engine, sizes_before)
    for worker in engine.workers:
        slot = worker.slot
        tokens = slot.tokens_done - before[slot.name][0]
        last = slot.last_done_at if tokens else started
        devices[slot.name] = {
            "tokens": tokens,
            "token_share": round(tokens / result.tokens, 4),
            "busy_s": round(slot.busy_s - before[slot.name][1], 3),
            "end_idle_s": round(ended - (last or started), 4),
            "tokens_per_s_measured": round(slot.effective_rate()),
            "batches_by_tokens": sizes[slot.name],
        }
    return {
        "makespan_s": ended - started,
        "tokenized_s": result.tokenize_s,  # when the last text was queued: the feed's pace
        "tokens": result.tokens,
        "devices": devices,
    }


async def alternating(engines: dict[str, Any], texts: list[str], runs: int) -> dict[str, Any]:
    """Each engine's median run of `runs`, taking turns; a warm-up pass each first."""
    for engine in engines.values():
        await engine.embed(texts)
    trials = await take_turns(
        {name: partial(converging, engine, texts) for name, engine in engines.items()}, runs
    )
    result = {}
    for name, got in trials.items():
        result[name] = median_run(got, lambda run: run["makespan_s"])
        result[name]["runs_s"] = [round(run["makespan_s"], 4) for run in got]
        result[name]["tokenized_runs_s"] = [round(run["tokenized_s"], 4) for run in got]
        result[name]["token_shares_runs"] = [
            {device: d["token_share"] for device, d in run["devices"].items()} for run in got
        ]
    return result


async def static_split(engines: list[Any], parts: list[list[str]]) -> list[float]:
    """One run: each engine embeds its part, concurrently; when each finished."""

    async def run(engine: Any, part: list[str]) -> float:
        if part:
            await engine.embed(part)
        return time.monotonic()

    started = time.monotonic()
    finished = await asyncio.gather(*(run(e, p) for e, p in zip(engines, parts, strict=True)))
    return [f - started for f in finished]


async def static_splits(
    engines: list[Any],
    texts: list[str],
    splits: dict[str, list[float]],
    lengths: list[int],
    runs: int,
) -> dict[str, dict[str, Any]]:
    """Each split's median run of `runs`, the splits taking turns.
    A split gives each engine a fixed contiguous range of the length-sorted texts: `shares`
    are shares of the tokens (`lengths` holds each text's), the first engine taking the
    longest texts."""
    from tests.support.simulation import split_by_tokens

    # Each engine gets its texts in the caller's order, as the other policies do: sorted ones
    # are a head start no policy gets (sorting needs every text tokenized first).
    parts = {
        name: [[texts[i] for i in sorted(part)] for part in split_by_tokens(lengths, shares)]
        for name, shares in splits.items()
    }
    for split in parts.values():  # a warm-up each: every engine meets its part's shapes
        await static_split(engines, [part[: max(1, len(part) // 20)] for part in split])
    trials = await take_turns(
        {name: partial(static_split, engines, split) for name, split in parts.items()}, runs
    )
    result = {}
    for name, got in trials.items():
        median = median_run(got, max)
        shares = splits[name]
        result[name] = {
            "token_shares": [round(s / sum(shares), 4) for s in shares],
            "makespan_s": max(median),
            "end_idle_s": [round(max(median) - f, 4) for f in median],
            "runs_s": [round(max(run), 4) for run in got],
        }
    return result


def token_lengths(directory: Path, length: int, texts: list[str]) -> list[int]:
    tokenizer = fast_tokenizer(directory, length)
    return [len(e.ids) for e in tokenizer.encode_batch_fast(texts)]


async def measure(
    args: argparse.Namespace, directory: Path, pooling: str, length: int
) -> dict[str, Any]:
    from embedx.config import load_settings
    from embedx.devices import discover

    texts = load_corpus(args.corpus, args.repeat)
    keys = args.devices.split(",")
    result: dict[str, Any] = {"devices": keys, "texts": len(texts)}
    alone = await open_engine(directory, pooling, length, keys[0], args.max_batch_tokens)
    pair = await open_engine(directory, pooling, length, args.devices, args.max_batch_tokens)
    engines = {"fastest_alone": alone, "converging": pair}
    if args.control:  # loaded last, so a cost of loading second would show here too
        engines["control"] = await open_engine(
            directory, pooling, length, keys[0], args.max_batch_tokens
        )
    timed = await alternating(engines, texts, args.runs)
    result.update(timed)
    for engine in list(engines.values())[1:]:
        await engine.close()
    alone_s = result["fastest_alone"]["makespan_s"]
    result["converging_vs_alone"] = result["converging"]["makespan_s"] / alone_s
    # Round by round: the two ran back to back, so a drift in the host's speed cancels out.
    result["converging_vs_alone_paired"] = paired_ratio(
        result["converging"]["runs_s"], result["fastest_alone"]["runs_s"]
    )
    if args.control:  # the same device alone against itself: the measurement's own bias
        result["control_vs_alone_paired"] = paired_ratio(
            result["control"]["runs_s"], result["fastest_alone"]["runs_s"]
        )
    if args.static:
        scores = {d.key: d.score for d in discover(load_settings({"devices": args.devices}))}
        # the first device's engine is `alone`: loading takes longer than the runs do
        split_engines = [alone] + [
            await open_engine(directory, pooling, length, k, args.max_batch_tokens)
            for k in keys[1:]
        ]
        lengths = token_lengths(directory, length, texts)
        splits = {"even": [1.0] * len(keys), "by_score": [scores[k] for k in keys]}
        if len(keys) == 2:
            splits.update({str(share): [share, 1 - share] for share in args.oracle_grid})
        timed = await static_splits(split_engines, texts, splits, lengths, args.runs)
        static: dict[str, Any] = {"even": timed["even"], "by_score": timed["by_score"]}
        if len(keys) == 2:
            trials = {share: timed[str(share)] for share in args.oracle_grid}
            best = min(trials, key=lambda s: trials[s]["makespan_s"])
            static["best_in_hindsight"] = trials[best]
            static["search"] = {str(k): round(v["makespan_s"], 4) for k, v in trials.items()}
        for engine in split_engines[1:]:
            await engine.close()
        result["static"] = static
        best = static.get("best_in_hindsight", static["even"])["makespan_s"]
        result["converging_vs_best_static"] = result["converging"]["makespan_s"] / best
    await alone.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--devices", required=True, help="the mixed set, fastest first, e.g. 0,cpu")
    parser.add_argument(
        "--corpus", nargs="+", default=list(DEFAULT_CORPUS), metavar="PATH", help=CORPUS_HELP
    )
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-batch-tokens", type=int, default=262144)  # as throughput.py
    parser.add_argument("--runs", type=int, default=3, help="timed runs each; medians count")
    parser.add_argument("--static", action="store_true", help="also run the static splits")
    parser.add_argument(
        "--control",
        action="store_true",
        help="also time a second engine on the fastest device alone, loaded last, taking "
        "turns with the others: how far two identical engines differ here",
    )
    parser.add_argument("--oracle-grid", type=float, nargs="+",
                        default=[0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9])  # fmt: skip
    parser.add_argument("--note", default="", help="recorded as is, e.g. the co-tenant's setup")
    parser.add_argument("--out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        directory, pooling, length = model_directory(args.model, Path(workdir), False, "cuda")
        result = asyncio.run(measure(args, directory, pooling, length))
    result.update(benchmark="mixed", model=args.model, note=args.note, environment=environment())
    write_json(result, args.out)


if __name__ == "__main__":
    main()
