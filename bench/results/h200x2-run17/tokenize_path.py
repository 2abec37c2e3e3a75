"""Scratch (h200x2-run17 `7-`): where a request's time goes in the engine, without HTTP.

64 callers embed the load test's texts 256 at a time (as in many_callers.py), with the
tokenizer's steps clocked per request: queued for the tokenizer's thread, its call's encode
start and end, handed out by the collecting thread, settled on the loop, submitted to the
queue, done. Prints medians (ms) of each step over two passes after a warm-up; then the same
for one call over every text. From bench/: python3 results/h200x2-run17/tokenize_path.py OUT
"""

import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from contextvars import ContextVar

sys.path.insert(0, os.getcwd())
from common import DEFAULT_CORPUS
from load import MINILM, open_served_engine, repeated_texts

import embedx.models.tokenizer as tok

clock = time.monotonic
marks: dict[int, dict[str, float]] = {}  # id(future) -> step -> time
last_encode: list[tuple[float, float]] = []
current: ContextVar[dict[str, float] | None] = ContextVar("current", default=None)

original_start, original_encode, original_hand, original_settle, original_call = (
    tok.TextTokenizer._start,
    tok.TextTokenizer._encode,
    tok._hand,
    tok._settle,
    tok._Call,
)


def _start(self, texts, *, truncate, offset):  # type: ignore[no-untyped-def]
    future = original_start(self, texts, truncate=truncate, offset=offset)
    mark = current.get()
    if mark is not None:  # the caller's own request, in its task's context
        mark["queued"] = clock()
        marks[id(future)] = mark
    return future


def _encode(self, texts):  # type: ignore[no-untyped-def]
    started = clock()
    try:
        return original_encode(self, texts)
    finally:
        last_encode.append((started, clock()))


def _call(waiters, encodings):  # type: ignore[no-untyped-def]
    started, ended = last_encode[-1]
    for waiter in waiters:
        mark = marks.get(id(waiter.future))
        if mark is not None:
            mark["encode_start"], mark["encode_end"] = started, ended
    return original_call(waiters, encodings)


def _hand(waiter, result):  # type: ignore[no-untyped-def]
    mark = marks.get(id(waiter.future))
    if mark is not None:
        mark["handed"] = clock()
    original_hand(waiter, result)


def _settle(future, result):  # type: ignore[no-untyped-def]
    mark = marks.get(id(future))
    if mark is not None:
        mark["settled"] = clock()
    original_settle(future, result)


tok.TextTokenizer._start, tok.TextTokenizer._encode = _start, _encode  # type: ignore[method-assign]
tok._hand, tok._settle, tok._Call = _hand, _settle, _call  # type: ignore[assignment]

STEPS = ["queued", "encode_start", "encode_end", "handed", "settled"]


async def main() -> object:
    from embedx.engine import EmbedOptions

    os.sched_setaffinity(0, set(range(int(os.environ.get("LIBRARY_CORES", 16)))))
    texts = repeated_texts(list(DEFAULT_CORPUS), int(os.environ.get("REQUESTS", 800)) * 256)
    engine = await open_served_engine(MINILM, None, 262144)
    rows = []

    async def callers(count: int) -> float:
        batches = [texts[i : i + 256] for i in range(0, len(texts), 256)][::-1]

        async def caller() -> None:
            while batches:
                mark: dict[str, float] = {}
                current.set(mark)
                started = clock()
                result = await engine.embed(batches.pop(), EmbedOptions(base64=True))
                if all(s in mark for s in STEPS):
                    mark["embed"] = started
                    mark["submitted"] = started + result.tokenize_s
                    mark["done"] = started + result.total_s
                    rows.append(mark)

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(count)))
        return time.perf_counter() - started

    results = {}
    try:
        for count in (64, 256):
            await callers(count)
            rows.clear()
            seconds = [await callers(count) for _ in range(2)]
            steps = ["embed", *STEPS, "submitted", "done"]
            results[f"{count} callers"] = {
                "seconds": [round(s, 3) for s in seconds],
                "requests": len(rows),
                "median_ms": {
                    f"{a}->{b}": round(1000 * statistics.median(r[b] - r[a] for r in rows), 1)
                    for a, b in itertools.pairwise(steps)
                },
                "p90_ms": {
                    f"{a}->{b}": round(
                        1000 * statistics.quantiles([r[b] - r[a] for r in rows], n=10)[-1], 1
                    )
                    for a, b in itertools.pairwise(steps)
                },
            }
            print(count, json.dumps(results[f"{count} callers"]), flush=True)
    finally:
        await engine.close()
    return results


if __name__ == "__main__":
    import uvloop

    with open(sys.argv[1], "w") as f:
        json.dump(uvloop.run(main()), f, indent=1)
