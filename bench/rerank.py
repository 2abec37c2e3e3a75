"""Reranking: embedx (library and server) against sentence-transformers' CrossEncoder and
infinity, on the same pairs, in one run.

    python bench/rerank.py [--tiny] [--infinity-site DIR] [--out FILE]

The model is bge-reranker-v2-m3's shape (XLM-RoBERTa large with one label) with random
weights and a sentencepiece (Unigram) tokenizer of 32,000 pieces trained on the corpus, as
XLM-R's is (its 250,002 pieces cannot be had offline): built here, the same for every
system, so pairs and tokens are alike. Each query is a short line (the first words of a
fortune), paired with `--documents` passages (English Wikipedia paragraphs), one query a
request. Reported: pairs/s and tokens/s for the library (every pair in one call), the
server under `--clients` concurrent requests (in client processes of their own),
CrossEncoder in float16 at batch 32, and infinity's /rerank under the same clients; and the
latency of one query with 100 documents, nothing else in flight, for the library, the
server and infinity. infinity runs only where `--infinity-site` names a folder holding it
and its dependencies (a pip `--target`), in a process of its own with that folder first on
its path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from common import corpus_path, environment, read_texts, wait_up, write_json
from load import parse_cores, pin_cores

SHAPE = "xlm-roberta-large"  # bge-reranker-v2-m3's: XLMRobertaForSequenceClassification
LENGTH = 512
CORPORA = ("fortunes", "enwiki_paragraphs")  # the queries' and the documents'
PIECES = 32000
MODEL_NAME = "reranker"  # its name in the server's catalog


def build_model(workdir: Path, tiny: bool, device: str) -> Path:
    from embedx.models.random_init import build_classifier, build_unigram_tokenizer

    texts = [text for name in CORPORA for text in read_texts(corpus_path(name))]
    build_unigram_tokenizer(workdir / "tokenizer", texts, vocab_size=PIECES)
    directory = workdir / "reranker"
    build_classifier(SHAPE, directory, workdir / "tokenizer", ["relevance"], tiny=tiny,
                     device=device)  # fmt: skip
    return directory


def make_requests(queries: int, documents: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    """`queries` (query, documents) requests: a fortune's first words, and Wikipedia
    paragraphs."""
    rng = random.Random(seed)
    lines = [t.split("\n")[0] for t in read_texts(corpus_path(CORPORA[0])) if t.strip()]
    passages = [t for t in read_texts(corpus_path(CORPORA[1])) if t.strip()]
    requests = []
    for _ in range(queries):
        query = " ".join(rng.choice(lines).split()[:12])
        requests.append((query, rng.sample(passages, documents)))
    return requests


def pairs_of(requests: Sequence[tuple[str, list[str]]]) -> list[tuple[str, str]]:
    return [(query, doc) for query, docs in requests for doc in docs]


def count_tokens(directory: Path, pairs: list[tuple[str, str]]) -> int:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(LENGTH, strategy="longest_first")
    return sum(len(e) for e in tokenizer.encode_batch_fast(pairs))


def rates(pairs: int, tokens: int, seconds: float) -> dict[str, Any]:
    return {"pairs": pairs, "seconds": seconds, "pairs_per_s": pairs / seconds,
            "tokens_per_s": tokens / seconds}  # fmt: skip


def latency(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}  # fmt: skip


def run_library(
    directory: Path, requests: list[tuple[str, list[str]]], tokens: int, args: argparse.Namespace
) -> dict[str, Any]:
    from embedx import Reranker, heap

    heap.manage()  # the process's collector tuned as `embedx serve` tunes it
    pairs = pairs_of(requests)
    budget = {"max_batch_tokens": args.max_batch_tokens} if args.max_batch_tokens else {}
    with Reranker(str(directory), **budget) as reranker:
        reranker.predict(pairs)  # warm: every batch shape the run meets
        started = time.perf_counter()
        scores = reranker.predict(pairs)
        seconds = time.perf_counter() - started
        alone = []
        for query, docs in requests[: args.latency_requests]:
            began = time.perf_counter()
            reranker.rank(query, docs)
            alone.append(time.perf_counter() - began)
    np.save(args.workdir / "embedx_scores.npy", scores)
    return {**rates(len(pairs), tokens, seconds), "one_query": latency(alone)}


def run_cross_encoder(
    directory: Path, requests: list[tuple[str, list[str]]], tokens: int, device: str
) -> dict[str, Any]:
    import torch
    from sentence_transformers import CrossEncoder

    half = torch.float16 if device.startswith("cuda") else torch.float32
    model = CrossEncoder(str(directory), device=device, max_length=LENGTH,
                         model_kwargs={"torch_dtype": half})  # fmt: skip
    pairs = pairs_of(requests)
    model.predict(pairs[:256], batch_size=32)
    started = time.perf_counter()
    scores = model.predict(pairs, batch_size=32, show_progress_bar=False)
    seconds = time.perf_counter() - started
    return {**rates(len(pairs), tokens, seconds), "dtype": str(half).removeprefix("torch."),
            "batch_size": 32, "scores": np.asarray(scores, np.float32)}  # fmt: skip


def _client(job: tuple[str, str, list[dict[str, Any]], int, set[int] | None]) -> list[float]:
    """One client process, on `cores`: its share of the requests over `concurrency`
    connections."""
    import httpx

    url, path, bodies, concurrency, cores = job
    pin_cores(cores)

    async def run() -> list[float]:
        times: list[float] = []
        queue = list(bodies)
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:

            async def worker() -> None:
                while queue:
                    body = queue.pop()
                    began = time.perf_counter()
                    response = await client.post(path, json=body)
                    response.raise_for_status()
                    times.append(time.perf_counter() - began)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return times

    return asyncio.run(run())


def drive(
    url: str, path: str, bodies: list[dict[str, Any]], args: argparse.Namespace
) -> tuple[float, list[float]]:
    """Send every body with `clients` in flight, from `processes` processes: the seconds it
    took, and each request's latency."""
    processes, cores = args.client_processes, args.client_cores
    shares = [bodies[i::processes] for i in range(processes)]
    per = max(1, args.clients // processes)
    with ProcessPoolExecutor(processes) as pool:
        list(pool.map(_client, [(url, path, s[:per], per, cores) for s in shares]))  # warm
        started = time.perf_counter()
        done = list(pool.map(_client, [(url, path, s, per, cores) for s in shares]))
        seconds = time.perf_counter() - started
    return seconds, [t for times in done for t in times]


def one_at_a_time(url: str, path: str, bodies: list[dict[str, Any]]) -> list[float]:
    import httpx

    times = []
    with httpx.Client(base_url=url, timeout=600) as client:
        client.post(path, json=bodies[0]).raise_for_status()
        for body in bodies:
            began = time.perf_counter()
            client.post(path, json=body).raise_for_status()
            times.append(time.perf_counter() - began)
    return times


def run_server(
    directory: Path, requests: list[tuple[str, list[str]]], tokens: int, args: argparse.Namespace
) -> dict[str, Any]:
    models = args.workdir / "models.toml"
    models.write_text(f'[models.{MODEL_NAME}]\nsource = "{directory}"\n')
    env = {**os.environ, "EMBEDX_PORT": str(args.port), "EMBEDX_MODELS_FILE": str(models),
           "EMBEDX_PRELOAD": MODEL_NAME, "EMBEDX_LOG_LEVEL": "warning"}  # fmt: skip
    if args.max_batch_tokens:
        env["EMBEDX_MAX_BATCH_TOKENS"] = str(args.max_batch_tokens)
    server = subprocess.Popen(
        [*args.server_cores, sys.executable, "-m", "embedx", "serve"], env=env
    )
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_up(url, server)
        bodies = [{"model": MODEL_NAME, "query": q, "documents": d} for q, d in requests]
        seconds, times = drive(url, "/v1/rerank", bodies, args)
        alone = one_at_a_time(url, "/v1/rerank", bodies[: args.latency_requests])
    finally:
        server.terminate()
        server.wait(60)
    return {**rates(len(pairs_of(requests)), tokens, seconds), "under_load": latency(times),
            "one_query": latency(alone), "clients": args.clients}  # fmt: skip


def run_infinity(
    directory: Path,
    requests: list[tuple[str, list[str]]],
    tokens: int,
    device: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    site = Path(args.infinity_site).resolve()
    env = {**os.environ, "PYTHONPATH": str(site), "INFINITY_ANONYMOUS_USAGE_STATS": "0",
           "DO_NOT_TRACK": "1"}  # fmt: skip
    port = args.port + 1
    command = [*args.server_cores, sys.executable, "-m", "infinity_emb.cli", "v2",
               "--model-id", str(directory), "--engine", "torch", "--device", device,
               "--port", str(port)]  # fmt: skip
    server = subprocess.Popen(command, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url, server)
        bodies = [{"model": str(directory), "query": q, "documents": d} for q, d in requests]
        seconds, times = drive(url, "/rerank", bodies, args)
        alone = one_at_a_time(url, "/rerank", bodies[: args.latency_requests])
    finally:
        server.terminate()
        server.wait(60)
    return {**rates(len(pairs_of(requests)), tokens, seconds), "under_load": latency(times),
            "one_query": latency(alone), "clients": args.clients, "version": "0.0.78"}  # fmt: skip


def _ratios(methods: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The ratios embedx is held to, in pairs/s: embedx over each peer, the server over the
    library."""
    rate = {name: m["pairs_per_s"] for name, m in methods.items()}
    wanted = {"server_over_library": ("embedx_server", "embedx_library"),
              "server_over_infinity": ("embedx_server", "infinity"),
              "library_over_infinity": ("embedx_library", "infinity"),
              "library_over_cross_encoder": ("embedx_library", "cross_encoder")}  # fmt: skip
    return {key: rate[a] / rate[b] for key, (a, b) in wanted.items() if a in rate and b in rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random model (CPU smoke run)")
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--documents", type=int, default=100, help="documents a query")
    parser.add_argument("--clients", type=int, default=16, help="requests in flight")
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--client-cores", type=parse_cores, help="cores for the clients: 12-15")
    parser.add_argument(
        "--server-cores", default="", help="cores for the library, CrossEncoder and the servers"
    )
    parser.add_argument("--peer-queries", type=int, default=100,
                        help="queries the peers (CrossEncoder, infinity) get")  # fmt: skip
    parser.add_argument("--latency-requests", type=int, default=50)
    parser.add_argument("--max-batch-tokens", type=int,
                        help="the library's and the server's cap (default: embedx's)")  # fmt: skip
    parser.add_argument("--port", type=int, default=8490)
    parser.add_argument("--skip", nargs="*", default=[], help="library server cross_encoder")
    parser.add_argument("--infinity-site", help="a folder holding infinity-emb and its needs")
    parser.add_argument("--out")
    args = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    pin_cores(parse_cores(args.server_cores) if args.server_cores else None)  # the library's too
    args.server_cores = ["taskset", "-c", args.server_cores] if args.server_cores else []
    with tempfile.TemporaryDirectory() as work:
        args.workdir = Path(work)
        directory = build_model(args.workdir, args.tiny, device)
        requests = make_requests(args.queries, args.documents)
        pairs = pairs_of(requests)
        tokens = count_tokens(directory, pairs)
        peers = requests[: args.peer_queries]  # the slower peers' share: rates per second
        peer_tokens = count_tokens(directory, pairs_of(peers))
        result: dict[str, Any] = {"environment": environment(), "model": f"{SHAPE}, one label",
                                  "tiny": args.tiny, "queries": args.queries,
                                  "peer_queries": len(peers),
                                  "documents_per_query": args.documents, "pairs": len(pairs),
                                  "max_batch_tokens": args.max_batch_tokens or "default",
                                  "tokens": tokens, "methods": {}}  # fmt: skip
        methods = result["methods"]

        def measured(name: str, figures: dict[str, Any]) -> None:
            """Each method's figures on disk as they come: a run cut short keeps them."""
            methods[name] = figures
            result["ratios"] = _ratios(methods)
            if args.out:
                Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

        if "library" not in args.skip:
            measured("embedx_library", run_library(directory, requests, tokens, args))
        if "server" not in args.skip:
            measured("embedx_server", run_server(directory, requests, tokens, args))
        if "cross_encoder" not in args.skip:
            crossed = run_cross_encoder(directory, peers, peer_tokens, device)
            ours = args.workdir / "embedx_scores.npy"
            if ours.exists():  # float16 against bfloat16 and float32 sums: close, not equal
                gap = np.abs(np.load(ours)[: len(pairs_of(peers))] - crossed.pop("scores"))
                crossed["max_abs_diff_vs_embedx"] = float(gap.max())
            else:
                crossed.pop("scores")
            measured("cross_encoder", crossed)
        if args.infinity_site:
            measured("infinity", run_infinity(directory, peers, peer_tokens, device, args))
    write_json(result, args.out)


if __name__ == "__main__":
    main()
