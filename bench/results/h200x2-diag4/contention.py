"""Does the event loop's thread holding the GIL slow the tokenizer? MiniLM's tokenizer over
the load corpus, in calls of CHUNK texts one after another (as the engine makes them), while
the loop's thread runs Python for a share (duty) of the time in slices of SLICE µs.

    python3 contention.py OUT.json   (from bench/, on the cores the server gets)
"""

import asyncio
import json
import sys
import time

import uvloop
from common import fast_tokenizer, load_corpus
from throughput import minilm_directory

texts = load_corpus(repeat=4)[:81920]
tokenizer = fast_tokenizer(minilm_directory(), 256)


async def encode_async(chunk: list[str]) -> object:
    return await tokenizer.async_encode_batch_fast(chunk)


async def encode_thread(chunk: list[str]) -> object:
    return await asyncio.to_thread(tokenizer.encode_batch_fast, chunk)


async def tokenize_all(encode, size: int) -> float:
    started = time.perf_counter()
    for i in range(0, len(texts), size):
        await encode(texts[i : i + size])
    return time.perf_counter() - started


async def hold(stop: asyncio.Event, slice_s: float, duty: float) -> None:
    """Hold the GIL for slice_s, release it (time.sleep) for the rest, let the loop run."""
    while not stop.is_set():
        until = time.perf_counter() + slice_s
        while time.perf_counter() < until:
            pass
        time.sleep(slice_s * (1 / duty - 1))  # noqa: ASYNC251 (the point: GIL released)
        await asyncio.sleep(0)


async def main() -> list[dict[str, object]]:
    rows = []
    for encode in (encode_async, encode_thread):
        for size in (2332, 4096):
            await tokenize_all(encode, size)  # warm
            for slice_us, duty in ((0, 0), (50, 0.85), (200, 0.85), (1000, 0.85), (200, 0.5)):
                stop = asyncio.Event()
                holder = asyncio.create_task(hold(stop, slice_us / 1e6, duty)) if duty else None
                seconds = await tokenize_all(encode, size)
                stop.set()
                if holder:
                    await holder
                row = {"call": encode.__name__, "chunk": size, "slice_us": slice_us,
                       "duty": duty, "texts_per_s": round(len(texts) / seconds)}  # fmt: skip
                print(row, flush=True)
                rows.append(row)
    return rows


results = uvloop.run(main())
with open(sys.argv[1], "w") as out:
    json.dump({"texts": len(texts), "rows": results}, out, indent=1)
