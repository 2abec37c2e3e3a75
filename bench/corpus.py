"""The corpus job's throughput against the library's, in one process, on the same texts.

    python bench/corpus.py MODEL [--corpus PATH ...] [--chunk-texts N] [--runs N] [--out FILE]

MODEL as bench/throughput.py takes it: `minilm`, a directory, or a random-weight shape
(`--tiny` for tests). The texts are written to one JSONL file; then, on the same loaded
model, `Embedder.embed` of all of them in one call (the library's best case) and the corpus
job (`embedx embed ... -o OUT.parquet`: reading, chunking, embedding, writing and joining),
alternately, after one warm-up pass of each. Prints JSON: each one's median tokens/s over
--runs, tokenization included, and the job's share of the library's (issue 40 asks 0.95 on
an H200).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
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
from embedx.jobs.corpus import CHUNK_TEXTS, ChunkEmbedder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--corpus", nargs="+", default=list(DEFAULT_CORPUS), help=CORPUS_HELP)
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    parser.add_argument("--chunk-texts", type=int, default=CHUNK_TEXTS)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="tiny random shapes (tests)")
    parser.add_argument("--out")
    args = parser.parse_args()

    import torch

    texts = load_corpus(args.corpus, args.repeat)
    settings = load_settings({})  # EMBEDX_MAX_BATCH_TOKENS and the rest, from the environment
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        directory, pooling, length = model_directory(args.model, work, args.tiny, device)
        tokens = sum(len(e.ids) for e in fast_tokenizer(directory, length).encode_batch(texts))
        source = work / "corpus.jsonl"
        source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        output = work / "out.parquet"
        job = CorpusJob(args.model, [str(source)], output, chunk_texts=args.chunk_texts)
        seconds: dict[str, list[float]] = {"library": [], "job": []}
        with ChunkEmbedder(directory, pooling=pooling, max_seq_len=length) as embedder:
            for attempt in range(args.runs + 1):  # the first of each is a warm-up
                started = time.perf_counter()
                embedder.embed(texts)
                library = time.perf_counter() - started
                started = time.perf_counter()
                run(job, settings, io.StringIO(), embedder)
                whole_job = time.perf_counter() - started
                if attempt:
                    seconds["library"].append(library)
                    seconds["job"].append(whole_job)
    result: dict[str, Any] = {
        "benchmark": "corpus",
        "model": args.model,
        "texts": len(texts),
        "tokens": tokens,
        "chunk_texts": args.chunk_texts,
        "runs": args.runs,
        "environment": environment(),
    }
    for name, runs in seconds.items():
        median = statistics.median(runs)
        result[name] = {"seconds": runs, "tokens_per_s": tokens / median}
    share = result["job"]["tokens_per_s"] / result["library"]["tokens_per_s"]
    result["job_share_of_library"] = round(share, 4)
    write_json(result, args.out)


if __name__ == "__main__":
    main()
