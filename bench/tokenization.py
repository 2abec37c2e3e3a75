"""How to tokenize without holding up the devices: chunking, and what runs beside what.

    python bench/tokenization.py [--out FILE]

Each variant tokenizes the default corpus with the all-MiniLM-L6-v2 tokenizer (256 cut) and
takes the ids out of the encodings into numpy (`collect`, Python work under the GIL):
- sequential: one call, then its collect, then the next call;
- pipelined: embedx's own `TextTokenizer.encode_chunks`, where the tokenizer's thread
  makes each call and a second thread collects it, while the event loop handles the chunk
  before;
- concurrent_4: four calls in flight at once.
Then long documents (`--long-corpus`, cut to the same 256 tokens): the tokenizer called on
each whole text, against `TextTokenizer`, which tokenizes a window of the start of each far
longer than that (the same ids: tests/test_tokenizer.py). Last, `input_order`: the
pipelined variant on the corpus as it comes, shuffled, and sorted by length in characters,
taking turns for --order-rounds rounds (medians, and each order's round-by-round ratio to
the corpus's).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from common import (
    corpus_path,
    environment,
    load_corpus,
    paired_ratio,
    read_texts,
    take_turns,
    write_json,
)
from throughput import minilm_directory

from embedx.models.source import resolve
from embedx.models.tokenizer import FIRST_CHUNK, TextTokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--long-corpus", default="pydocs_pages")
    parser.add_argument("--order-rounds", type=int, default=9)
    parser.add_argument("--out")
    args = parser.parse_args()
    texts = load_corpus()
    tokenizer = TextTokenizer(resolve(str(minilm_directory())), 256)
    rust = tokenizer._tokenizer
    started = time.perf_counter()
    encodings = rust.encode_batch_fast(texts)
    one_call = time.perf_counter() - started
    started = time.perf_counter()
    tokens = tokenizer._gather(encodings, truncate=True, offset=0).ids.size
    collect = time.perf_counter() - started
    result: dict[str, Any] = {
        "benchmark": "tokenization",
        "environment": environment(),
        "texts": len(texts),
        "tokens": tokens,
        "one_call_s": one_call,
        "collect_s": collect,
        "tokens_per_s": {},
    }

    async def sequential(chunk: int) -> None:
        for start in range(0, len(texts), chunk):
            part = texts[start : start + chunk]
            tokenizer._gather(await rust.async_encode_batch_fast(part), truncate=True, offset=0)

    async def pipelined() -> None:
        async for _ in tokenizer.encode_chunks(texts):
            pass

    async def concurrent(chunk: int, ahead: int) -> None:
        pending: list[Any] = []
        for start in range(0, len(texts), chunk):
            pending.append(rust.async_encode_batch_fast(texts[start : start + chunk]))
            if len(pending) == ahead:
                tokenizer._gather(await pending.pop(0), truncate=True, offset=0)
        for future in pending:
            tokenizer._gather(await future, truncate=True, offset=0)

    variants: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
        "sequential_chunk_1024": partial(sequential, FIRST_CHUNK),
        "sequential_chunk_4096": partial(sequential, 4096),
        "sequential_chunk_8192": partial(sequential, 8192),
        "pipelined": pipelined,
        "concurrent_4_chunk_4096": partial(concurrent, 4096, 4),
    }
    for name, variant in variants.items():
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            asyncio.run(variant())
            best = min(best, time.perf_counter() - started)
        result["tokens_per_s"][name] = round(tokens / best)
    result["long_documents"] = long_documents(tokenizer, read_texts(corpus_path(args.long_corpus)))
    result["long_documents"]["corpus"] = args.long_corpus
    result["input_order"] = input_order(tokenizer, texts, args.order_rounds)
    write_json(result, args.out)


def long_documents(tokenizer: TextTokenizer, texts: list[str]) -> dict[str, Any]:
    """Best of three: each text tokenized whole, and as `TextTokenizer` does (a window)."""
    seconds = {}
    for name, encode in (
        ("whole_s", lambda: tokenizer._tokenizer.encode_batch_fast(texts)),
        ("cut_first_s", lambda: tokenizer.encode_now(texts)),
    ):
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            encode()
            best = min(best, time.perf_counter() - started)
        seconds[name] = round(best, 4)
    return {"texts": len(texts), "chars_per_text": sum(map(len, texts)) // len(texts), **seconds}


def input_order(tokenizer: TextTokenizer, texts: list[str], rounds: int) -> dict[str, Any]:
    """Seconds to run `encode_chunks` over the texts in three orders, taking turns."""
    shuffled = texts[:]
    random.Random(0).shuffle(shuffled)
    orders = {"corpus": texts, "shuffled": shuffled, "by_length": sorted(texts, key=len)}

    async def pipelined(part: list[str]) -> float:
        started = time.perf_counter()
        async for _ in tokenizer.encode_chunks(part):
            pass
        return time.perf_counter() - started

    trials = {name: partial(pipelined, part) for name, part in orders.items()}
    runs = asyncio.run(take_turns(trials, rounds))
    result: dict[str, Any] = {"rounds": rounds}
    for name, seconds in runs.items():
        result[name] = {
            "median_s": round(statistics.median(seconds), 4),
            "vs_corpus_paired": round(paired_ratio(seconds, runs["corpus"]), 4),
        }
    return result


if __name__ == "__main__":
    main()
