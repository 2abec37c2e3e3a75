"""Where a request's time goes in the server, and the tokenizer's thread's time, from
timeline.patch's clocks. Usage: python3 timeline.py FILE.json[.gz]...
(the server's files: a line per step of a request; the library's: its tokenizer only)"""

import gzip
import itertools
import json
import statistics
import sys
from typing import Any

STEPS = [
    ("arrive to body read", "t0", "body"),
    ("body to embed (parse, admission)", "body", "embed"),
    ("embed to queued", "embed", "queued"),
    ("queued to its call's start", "queued", "enc_start"),
    ("its call encoding", "enc_start", "enc_end"),
    ("encoded to collector takes it", "enc_end", "got"),
    ("collector takes to handed", "got", "handed"),
    ("handed to settled on the loop", "handed", "settled"),
    ("settled to submitted", "settled", "submitted"),
    ("submitted to done (queue, GPU)", "submitted", "done"),
    ("done to response sent", "done", "end"),
    ("whole, at the server", "t0", "end"),
]


def quantiles(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    p50, p90 = (1000 * values[min(len(values) - 1, int(q * len(values)))] for q in (0.5, 0.9))
    return f"p50 {p50:7.1f}  p90 {p90:7.1f}  mean {1000 * statistics.fmean(values):7.1f} ms"


def load(path: str) -> dict[str, Any]:
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        data: dict[str, Any] = json.load(f)
    return data


def requests_report(data: dict[str, Any]) -> None:
    # the last two thirds: the warm-up and the first pass's start left out
    requests = [r for r in data["requests"] if "done" in r and "settled" in r]
    requests = requests[len(requests) // 3 :]
    by_seq = {c["seq"]: c for c in data["calls"]}
    for label, start, stop in STEPS:
        values = []
        for request in requests:
            merged = {**by_seq.get(request.get("call"), {}), **request}
            if start in merged and stop in merged:
                values.append(merged[stop] - merged[start])
        print(f"  {label:36s} {quantiles(values)}")


def tokenizer_report(data: dict[str, Any]) -> None:
    calls = [c for c in data["calls"] if "collected" in c]
    calls = calls[len(calls) // 3 :]
    if len(calls) < 2:
        return
    span = calls[-1]["collected"] - calls[0]["wait"]
    texts = statistics.fmean(c["texts"] for c in calls)
    waiters = statistics.fmean(c["waiters"] for c in calls)
    print(f"  tokenizer thread over {span:.2f} s, {len(calls)} calls, {texts:.0f} texts and")
    print(f"  {waiters:.1f} waiters each:")
    shares = [
        ("encoding", sum(c["enc_end"] - c["enc_start"] for c in calls)),
        ("  of it the thread's CPU (the GIL's part)",
         sum(c["cpu_enc_end"] - c["cpu_enc_start"] for c in calls)),
        ("idle, nothing queued", sum(max(0.0, c["first_queued"] - c["wait"]) for c in calls)),
        ("queued to woken", sum(c["woke"] - max(c["wait"], c["first_queued"]) for c in calls)),
        ("woken to freed", sum(c["freed"] - c["woke"] for c in calls)),
        ("  the thread's CPU from wait to freed",
         sum(c["cpu_freed"] - c["cpu_wait"] for c in calls)),
        ("freed to encoding (cut, list)", sum(c["enc_start"] - c["freed"] for c in calls)),
        ("encoded to next wait (put)",
         sum(n["wait"] - c["enc_end"] for c, n in itertools.pairwise(calls))),
        ("the collecting thread busy", sum(c["collected"] - c["got"] for c in calls)),
    ]  # fmt: skip
    for label, seconds in shares:
        print(f"    {label:44s} {seconds:6.3f} s  {100 * seconds / span:5.1f}%")


def main() -> None:
    for path in sys.argv[1:]:
        data = load(path)
        print(f"== {path}: {len(data['requests'])} requests, {len(data['calls'])} calls")
        if data["requests"]:
            requests_report(data)
        tokenizer_report(data)


if __name__ == "__main__":
    main()
