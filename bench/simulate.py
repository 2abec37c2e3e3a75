"""The converging queue against static splits, in deterministic simulation.

    python bench/simulate.py [--out DIR]

(the simulator is test code, in tests/support).

Fake devices (a rate in tokens/s, a fixed cost per batch, a token budget) claim from the
real ConvergingQueue on a simulated clock. For 2 to 8 devices, speed ratios from 1:1 to 1:20
(fastest to slowest, spaced evenly) and the token lengths of each real corpus, one job of
about 400k tokens per device (so every device has several batches of work) runs under: the
converging queue; the fastest device alone; a static even split; a static split by device
score (each device's nominal speed, off by up to 25%, as a spec sheet is); and the best
static split found by search in hindsight (the oracle). Then requests arrive at random at
80% of capacity and the queue wait is reported. Last, two GPU-like devices whose batch
times stray (the slow one by up to 25% either way, as a GPU time-sliced with co-tenants
did, the fast one 5%) run against the fastest alone and against the static split that is
best for their nominal speeds, run with the same draws.
Writes simulate.json and simulate.png into --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from pathlib import Path
from typing import Any

from common import corpus_path, environment, fast_tokenizer, read_texts, write_json

from tests.support.simulation import (
    Arrival,
    FakeDevice,
    oracle_static_split,
    simulate_converging,
    static_split,
)

CORPORA = ("fortunes", "enwiki_paragraphs", "lee_background", "mini_newsgroup", "pydocs_pages")
COUNTS = (2, 3, 4, 8)
RATIOS = (1, 2, 5, 10, 20)
FAST_RATE = 1e6  # tokens/s of the fastest device
FIXED_S = 0.002  # a batch's fixed cost: launches, copies
SCORE_ERROR = (0.8, 1.25)  # a static score's error, alternating over the devices


def corpus_lengths(name: str) -> list[int]:
    """Token lengths of a corpus (all-MiniLM-L6-v2 tokenizer, cut at 512)."""
    from throughput import minilm_directory

    tokenizer = fast_tokenizer(minilm_directory(), 512)
    return [len(e) for e in tokenizer.encode_batch_fast(read_texts(corpus_path(name)))]


def job(lengths: list[int], tokens: int, seed: int) -> list[int]:
    """A job drawn from a corpus' length distribution, about `tokens` long."""
    rng = random.Random(seed)
    drawn: list[int] = []
    total = 0
    while total < tokens:
        drawn.append(rng.choice(lengths))
        total += drawn[-1]
    return drawn


def devices(count: int, ratio: float) -> list[FakeDevice]:
    """`count` devices from FAST_RATE down to FAST_RATE / ratio; the faster half keeps two
    batches in flight with a large budget, as GPUs do."""
    made = []
    for i in range(count):
        rate = FAST_RATE / (1 + (ratio - 1) * i / max(1, count - 1))
        fast = i < count / 2
        made.append(FakeDevice(f"d{i}", rate, FIXED_S, 65536 if fast else 16384, 2 if fast else 1))
    return made


def one_config(fake: list[FakeDevice], lengths: list[int]) -> dict[str, Any]:
    converging = simulate_converging(fake, [Arrival(0.0, tuple(lengths))])
    alone = static_split(fake[:1], lengths, [1.0])
    even = static_split(fake, lengths, [1.0] * len(fake))
    scores = [d.rate * SCORE_ERROR[i % 2] for i, d in enumerate(fake)]
    by_score = static_split(fake, lengths, scores)
    oracle, shares = oracle_static_split(fake, lengths, steps=14)
    worked = [n for n, b in converging.batches.items() if b]
    idle = max(converging.end_idle(n) for n in worked) / converging.makespan
    return {
        "makespan_s": {
            "converging": converging.makespan,
            "fastest_alone": alone.makespan,
            "static_even": even.makespan,
            "static_by_score": by_score.makespan,
            "oracle_static": oracle.makespan,
        },
        "converging_vs_oracle": converging.makespan / oracle.makespan,
        "converging_vs_alone": converging.makespan / alone.makespan,
        "max_end_idle_share": idle,
        "token_share": {
            n: round(t / sum(converging.tokens.values()), 4) for n, t in converging.tokens.items()
        },
        "oracle_shares": [round(s / sum(shares), 4) for s in shares],
    }


def continuous(fake: list[FakeDevice], lengths: list[int], seed: int = 5) -> dict[str, Any]:
    """Requests of 1 to 64 texts arriving at random (Poisson) at 80% of capacity."""
    rng = random.Random(seed)
    capacity = sum(d.rate for d in fake)
    mean_tokens = statistics.mean(lengths) * 32.5
    arrivals, at = [], 0.0
    for _ in range(3000):
        at += rng.expovariate(0.8 * capacity / mean_tokens)
        arrivals.append(Arrival(at, tuple(rng.choice(lengths) for _ in range(rng.randint(1, 64)))))
    result = simulate_converging(fake, arrivals)
    waits = sorted(result.item_waits)
    latency = sorted(done - start for start, done in result.job_times)

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {
        "devices": len(fake),
        "load": 0.8,
        "requests": len(arrivals),
        "queue_wait_s": {"p50": pct(waits, 0.5), "p99": pct(waits, 0.99), "max": waits[-1]},
        "request_latency_s": {
            "p50": pct(latency, 0.5),
            "p99": pct(latency, 0.99),
            "max": latency[-1],
        },
    }


def jittered(lengths: list[int], tokens: int, ratio: float, seed: int) -> dict[str, float]:
    """Two GPU-like devices whose batch times stray, one job of `tokens` tokens."""
    fake = [
        FakeDevice("d0", FAST_RATE, FIXED_S, 65536, 2, jitter=0.05, seed=seed),
        FakeDevice("d1", FAST_RATE / ratio, FIXED_S, 65536, 2, jitter=0.25, seed=seed),
    ]
    work = job(lengths, tokens, seed)
    converging = simulate_converging(fake, [Arrival(0.0, tuple(work))])
    alone = static_split(fake[:1], work, [1.0])
    _, shares = oracle_static_split([dataclasses.replace(d, jitter=0.0) for d in fake], work, 14)
    planned = static_split(fake, work, shares)
    return {
        "converging_vs_alone": converging.makespan / alone.makespan,
        "converging_vs_planned_static": converging.makespan / planned.makespan,
        "max_end_idle_share": max(
            converging.end_idle(n) for n, b in converging.batches.items() if b
        )
        / converging.makespan,
    }


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(COUNTS), figsize=(4 * len(COUNTS), 3.6), sharey=True)
    policies = ("converging", "fastest_alone", "static_even", "static_by_score")
    for axis, count in zip(axes, COUNTS, strict=True):
        for policy in policies:
            points = []
            for ratio in RATIOS:
                rows = [r for r in results if r["devices"] == count and r["ratio"] == ratio]
                best = [r["makespan_s"]["oracle_static"] for r in rows]
                relative = [r["makespan_s"][policy] / b for r, b in zip(rows, best, strict=True)]
                points.append(statistics.mean(relative))
            axis.plot(RATIOS, points, marker="o", label=policy.replace("_", " "))
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_xscale("log")
        axis.set_xticks(RATIOS, [f"1:{r}" for r in RATIOS])
        axis.set_title(f"{count} devices")
        axis.set_xlabel("speed ratio, fastest:slowest")
    axes[0].set_ylabel("makespan / best static split")
    axes[0].set_ylim(0.9, 2.0)
    axes[-1].legend(fontsize=8)
    figure.suptitle("Converging queue vs static splits (mean over five corpora' length mixes)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/simulate")
    parser.add_argument("--tokens", type=int, default=400_000, help="job tokens per device")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    stats: dict[str, Any] = {}
    by_corpus = {name: corpus_lengths(name) for name in CORPORA}
    for seed, name in enumerate(CORPORA):
        lengths = by_corpus[name]
        stats[name] = {"texts": len(lengths), "median": statistics.median(lengths)}
        for count in COUNTS:
            work = job(lengths, args.tokens * count, seed)
            for ratio in RATIOS:
                row = one_config(devices(count, ratio), work)
                results.append({"corpus": name, "devices": count, "ratio": ratio, **row})
    load = [continuous(devices(n, 5), by_corpus["fortunes"]) for n in (2, 4)]
    straying = [
        jittered(by_corpus[name], 2 * args.tokens, ratio, seed)
        for name in CORPORA
        for ratio in (2, 3, 5)
        for seed in range(6)
    ]
    worst = {
        "converging_vs_oracle": max(r["converging_vs_oracle"] for r in results),
        "converging_vs_alone": max(r["converging_vs_alone"] for r in results),
        "max_end_idle_share": max(r["max_end_idle_share"] for r in results),
    }
    summary = {
        "benchmark": "simulate",
        "configurations": len(results),
        "job_tokens_per_device": args.tokens,
        "worst": worst,
        "criteria": {
            "within_3pct_of_oracle": worst["converging_vs_oracle"] <= 1.03,
            "never_1pct_slower_than_fastest_alone": worst["converging_vs_alone"] <= 1.01,
            "end_idle_under_2pct": worst["max_end_idle_share"] < 0.02,
        },
        "continuous_load": load,
        "straying_batch_times": {
            "configurations": len(straying),
            **{
                f"{key}_{stat}": round(fn(r[key] for r in straying), 4)
                for key in straying[0]
                for stat, fn in (("worst", max), ("mean", statistics.fmean))
            },
        },
        "corpora": stats,
        "seconds": time.perf_counter() - started,
        "environment": environment(),
        "results": results,
    }
    plot(results, out / "simulate.png")
    write_json(summary, str(out / "simulate.json"))


if __name__ == "__main__":
    main()
