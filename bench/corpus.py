"""The corpus job's throughput against the library's, in one process, on the same texts.

    python bench/corpus.py MODEL [--corpus PATH ...] [--limit N] [--chunk-texts N] [--runs N]
                           [--device-rate TOKENS_PER_S] [--scratch DIR] [--out FILE]

MODEL as bench/throughput.py takes it: `minilm`, a directory, or a random-weight shape
(`--tiny` for tests). The texts are written to one JSONL file in --scratch (default: a
temporary folder; the job writes its chunks and output there, each chunk synced to disk);
then, on the same loaded model, `Embedder.embed` of all of them in one call (the library's
best case) and the corpus job (`embedx embed ... -o OUT.parquet`: reading, chunking,
embedding, writing), in turns whose order alternates, after one warm-up pass of each, with
the garbage collected and the last pass's output removed before each pass. `--device-rate`
stands a device of that speed in for the model's forward: a CPU machine's view of the host's
work beside a GPU.

Prints JSON: each one's median tokens/s over --runs, tokenization included; the job's share
of the library's (issue 40 asks 0.95 on an H200), from the medians and turn by turn; and the
job's stages, medians in seconds: before the first chunk reached the engine, the embedding,
after the last came back, and the busy seconds of its reading and writing threads (which
overlap the embedding).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import io
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    CORPUS_HELP,
    DEFAULT_CORPUS,
    DEFAULT_REPEAT,
    environment,
    fast_tokenizer,
    load_corpus,
    write_json,
)
from throughput import model_directory

from embedx.config import load_settings
from embedx.jobs import CorpusJob, run
from embedx.jobs.corpus import CHUNK_TEXTS, ChunkEmbedder, Stages

SIMULATED_HELP = (
    "tokens/s: each device's forward sleeps TOKENS / RATE seconds and computes nothing, so "
    "that the host's work (reading, tokenizing, writing) beside a device of that speed is "
    "measured on any machine"
)


def simulate_devices(embedder: ChunkEmbedder, rate: float) -> None:
    """Every device of the model a stand-in taking `tokens / rate` seconds a batch, in its
    own thread (as a GPU's time is), for rows of ones."""
    import torch

    for replica in embedder._engine.replicas:
        width = replica.model.dimensions

        def forward(batch: Any, width: int = width) -> torch.Tensor:
            time.sleep(batch.tokens / rate)
            return torch.ones(batch.count, width)

        replica.model.forward = forward  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--corpus", nargs="+", default=list(DEFAULT_CORPUS), help=CORPUS_HELP)
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    parser.add_argument("--limit", type=int, help="use only the first N texts")
    parser.add_argument("--chunk-texts", type=int, default=CHUNK_TEXTS)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scratch", help="the folder for the input and output files")
    parser.add_argument("--device-rate", type=float, help=SIMULATED_HELP)
    parser.add_argument("--tiny", action="store_true", help="tiny random shapes (tests)")
    parser.add_argument("--out")
    args = parser.parse_args()

    import torch

    texts = load_corpus(args.corpus, args.repeat)[: args.limit]
    settings = load_settings({})  # EMBEDX_MAX_BATCH_TOKENS and the rest, from the environment
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
        work = Path(scratch)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        directory, pooling, length = model_directory(args.model, work, args.tiny, device)
        tokens = sum(len(e.ids) for e in fast_tokenizer(directory, length).encode_batch(texts))
        source = work / "corpus.jsonl"
        source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        output = work / "out.parquet"
        job = CorpusJob(args.model, [str(source)], output, chunk_texts=args.chunk_texts)
        seconds: dict[str, list[float]] = {"library": [], "job": []}
        stages: list[Stages] = []
        with ChunkEmbedder(directory, pooling=pooling, max_seq_len=length) as embedder:
            if args.device_rate:
                simulate_devices(embedder, args.device_rate)
            passes: dict[str, Callable[[], Any]] = {
                "library": lambda: embedder.embed(texts),
                "job": lambda: run(job, settings, io.StringIO(), embedder, stages[-1]),
            }
            for attempt in range(args.runs + 1):  # the first of each is a warm-up
                stages.append(Stages())
                for name in sorted(passes, reverse=attempt % 2 == 1):
                    # as a job's first run, which writes a new file: replacing the last
                    # pass's output freed its blocks in the timed pass (50 to 100 ms, H100 host)
                    output.unlink(missing_ok=True)
                    gc.collect()
                    started = time.perf_counter()
                    passes[name]()
                    if attempt:
                        seconds[name].append(time.perf_counter() - started)
    result: dict[str, Any] = {
        "benchmark": "corpus",
        "model": args.model,
        "texts": len(texts),
        "tokens": tokens,
        "chunk_texts": args.chunk_texts,
        "device_rate": args.device_rate,
        "runs": args.runs,
        "environment": environment(),
    }
    for name, runs in seconds.items():
        median = statistics.median(runs)
        result[name] = {"seconds": runs, "tokens_per_s": tokens / median}
    share = result["job"]["tokens_per_s"] / result["library"]["tokens_per_s"]
    result["job_share_of_library"] = round(share, 4)
    turns = [library / job for library, job in zip(seconds["library"], seconds["job"], strict=True)]
    result["job_share_by_turn"] = [round(s, 4) for s in turns]
    result["job_stages_s"] = {
        name: round(statistics.median(getattr(s, name) for s in stages[1:]), 4)
        for name in (f.name for f in dataclasses.fields(Stages))
    }
    write_json(result, args.out)


if __name__ == "__main__":
    main()
