"""How to tokenize without holding up the devices: variants of chunking and concurrency.

    python bench/tokenization.py [--out FILE]

Each variant tokenizes the default corpus with the all-MiniLM-L6-v2 tokenizer (256 cut);
`collect` is the Python cost of taking the ids out of the encodings.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from common import environment, load_corpus, write_json
from throughput import minilm_directory


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunk", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--out")
    args = parser.parse_args()
    from tokenizers import Tokenizer

    texts = load_corpus()
    tokenizer = Tokenizer.from_file(str(minilm_directory() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)
    started = time.perf_counter()
    encodings = tokenizer.encode_batch_fast(texts)
    one_call = time.perf_counter() - started
    started = time.perf_counter()
    ids = [e.ids for e in encodings]
    collect = time.perf_counter() - started
    tokens = sum(map(len, ids))
    result: dict[str, Any] = {
        "benchmark": "tokenization",
        "environment": environment(),
        "texts": len(texts),
        "tokens": tokens,
        "one_call_s": one_call,
        "collect_ids_s": collect,
        "variants": {},
    }

    async def variants(chunk: int) -> dict[str, float]:
        chunks = [texts[i : i + chunk] for i in range(0, len(texts), chunk)]
        timings: dict[str, float] = {}
        started = time.perf_counter()
        for part in chunks:
            tokenizer.encode_batch_fast(part)
        timings["sync_sequential"] = time.perf_counter() - started
        started = time.perf_counter()
        for part in chunks:
            await tokenizer.async_encode_batch_fast(part)
        timings["async_sequential"] = time.perf_counter() - started
        for ahead in (2, 4, 8):
            for name, submit in (
                ("async", lambda p: asyncio.ensure_future(tokenizer.async_encode_batch_fast(p))),
                (
                    "thread",
                    lambda p: asyncio.ensure_future(
                        asyncio.to_thread(tokenizer.encode_batch_fast, p)
                    ),
                ),
            ):
                started = time.perf_counter()
                pending: list[Any] = []
                for part in chunks:
                    pending.append(submit(part))
                    if len(pending) == ahead:
                        [e.ids for e in await pending.pop(0)]
                for task in pending:
                    [e.ids for e in await task]
                timings[f"{name}_ahead_{ahead}_with_collect"] = time.perf_counter() - started
        return timings

    for chunk in args.chunk:
        timings = asyncio.run(variants(chunk))
        result["variants"][f"chunk_{chunk}"] = {k: round(tokens / v) for k, v in timings.items()}
    write_json(result, args.out)


if __name__ == "__main__":
    main()
