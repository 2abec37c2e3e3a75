"""The server under load from concurrent OpenAI SDK clients, against the library on the same texts.

    python bench/load.py [--model NAME] [--clients 32] [--batch 256] [--requests 1600]
                         [--passes 3] [--server-cores 0-15 --client-cores 16-31]
                         [--decoding sdk|numpy|body] [--corpus PATH ...] [--out FILE]

Loopback only. First the library embeds all the texts the clients will send (one `embed`
call, in this process); then a server starts in a subprocess on a free 127.0.0.1 port and
N AsyncOpenAI clients send the same texts in requests of --batch texts (base64, the SDK's
default; --decoding says who turns it into rows). Both get one warm-up pass, then the
median of --passes timed ones counts.
JSON out: requests/s, p50/p99 latency (and the part of it the server spent embedding),
tokens/s, server/library tokens/s, and where the CPU time went: the server's threads by
name, the clients, how busy the cores were, and the event-loop thread's CPU microseconds
per text in the library and in the server (one thread feeds every device: its cost per
text bounds both). With --server-cores the library and the
server run on those cores only, and --client-cores keeps the clients off them, as clients
on other machines would be.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from common import (
    CORPUS_HELP,
    DEFAULT_CORPUS,
    SPY_RATE,
    environment,
    load_corpus,
    wait_up,
    write_json,
)
from throughput import model_directory

if TYPE_CHECKING:
    from embedx.engine import Engine

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# How the clients read a response (`client_process`), as the JSON's "decoded_by" says it.
DECODINGS = {
    "sdk": "the SDK, into floats",
    "numpy": "numpy, in the client",
    "body": "orjson and numpy, in the client (no SDK objects)",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def record_stacks(pid: int, path: str, flags: list[str]) -> subprocess.Popen[bytes]:
    """py-spy sampling a process's threads until sent SIGINT, with `flags` (see
    `py_spy_flags`)."""
    command = ["py-spy", "record", "--pid", str(pid), "--threads", "--rate", str(SPY_RATE),
               "--format", "raw", "--output", path]  # fmt: skip
    recorder = subprocess.Popen(command + flags)
    time.sleep(1)
    return recorder


def py_spy_flags(native: bool, gil: bool) -> list[str]:
    """Without pausing the process, unless native frames are asked for (py-spy reads those
    only from a paused process); with `gil`, only the thread holding the interpreter lock."""
    return (["--native"] if native else ["--nonblocking"]) + (["--gil"] if gil else [])


def stop_recording(recorder: subprocess.Popen[bytes] | None) -> None:
    if recorder is not None:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(60)


def repeated_texts(corpus: list[str], count: int) -> list[str]:
    """`count` texts: the corpus's, over again as often as that takes."""
    texts = load_corpus(corpus, repeat=1)
    return (texts * -(-count // len(texts)))[:count]


async def open_served_engine(model: str, pooling: str | None, tokens: int) -> Engine:
    """The model on every device, as the server loads it, with `tokens` a batch at most."""
    from embedx.config import load_settings
    from embedx.devices import discover
    from embedx.engine import EngineOptions, open_engine
    from embedx.models.catalog import load_catalog
    from embedx.models.source import resolve
    from embedx.registry import LoadRequest, Names

    settings = load_settings({"max_batch_tokens": tokens})
    names = Names(settings, load_catalog(settings.models_file), local_paths=True)
    spec = names.spec_for(model, LoadRequest(pooling=pooling))
    options = EngineOptions.from_settings(settings)
    return await open_engine(spec, resolve(spec.source), discover(settings), options)


async def library_rate(
    model: str,
    pooling: str | None,
    texts: list[str],
    tokens: int,
    passes: int,
    py_spy: str | None,
    spy_flags: list[str],
) -> dict[str, Any]:
    """The median of `passes` timed `embed` calls over every text, after a warm-up one."""
    engine = await open_served_engine(model, pooling, tokens)
    try:
        await engine.embed(texts)  # warm-up, as the server gets
        recorder = record_stacks(os.getpid(), py_spy, spy_flags) if py_spy else None
        runs = []
        main_cpu_s = time.thread_time()
        tokenizer = engine.tokenizer
        before = (tokenizer.busy_s, tokenizer.idle_seconds(), tokenizer.free_s, tokenizer.collect_s)
        slots = [worker.slot for worker in engine.workers]
        launched = [(slot.batches_done, slot.launching_s) for slot in slots]
        for _ in range(passes):
            started = time.perf_counter()
            # Not kept past its pass: each pass's vectors then reuse the last one's memory, as
            # the server's responses do. Held while the next pass ran, they took fresh pages
            # (629 MB at 409,600 texts), whose first touch on a fresh VM faults on its host
            # too, on the event loop's thread as the rows are written.
            embedded = (await engine.embed(texts)).tokens
            runs.append(time.perf_counter() - started)
        main_cpu_s = time.thread_time() - main_cpu_s
        after = (tokenizer.busy_s, tokenizer.idle_seconds(), tokenizer.free_s, tokenizer.collect_s)
        launches = {
            slot.name: launch_figures(
                slot.launching_s - was_s, slot.batches_done - was_batches, sum(runs)
            )
            for slot, (was_batches, was_s) in zip(slots, launched, strict=True)
        }
        stop_recording(recorder)
    finally:
        await engine.close()
    seconds = statistics.median(runs)
    return {
        "tokens": embedded,
        "seconds": seconds,
        "runs_s": [round(run, 4) for run in runs],
        "tokens_per_s": embedded / seconds,
        "peak_rss_bytes": peak_rss_bytes(os.getpid()),  # the model's load and imports included
        # the event loop's thread: it also feeds the server's devices, one thread for all
        "main_thread_us_per_text": round(1e6 * main_cpu_s / (passes * len(texts)), 1),
        # shares of the timed passes, as the server's are given per pass
        "tokenizer": {
            f"{name}_fraction": round((b - a) / sum(runs), 3)
            for name, a, b in zip(("busy", "idle", "free", "collect"), before, after, strict=True)
        },
        "devices": launches,
    }


async def client_process(
    base_url: str,
    model: str,
    pooling: str | None,
    batches: list[list[str]],
    clients: int,
    decoding: str,
) -> tuple[list[float], list[float], list[float], list[float], int]:
    """One client process: `clients` requests in flight, each with the OpenAI SDK's
    `embeddings.create`. How a response is read (`DECODINGS`): "sdk", the SDK asks for base64
    and turns every row into Python floats; "numpy", the client asks for base64 itself, the
    SDK builds its response objects and the client decodes each row with numpy; "body", the
    client also reads the JSON body itself (orjson), skipping the SDK's objects, which cost
    more CPU than the rest of the request (the load generator's, not the server's)."""
    import numpy as np
    import openai
    import orjson

    client = openai.AsyncOpenAI(base_url=base_url, api_key="load-test", max_retries=0, timeout=600)
    # Asked for explicitly, base64 comes back as the strings; left to the SDK, as floats.
    asked: dict[str, Any] = {"encoding_format": "base64"} if decoding != "sdk" else {}
    extra = {"pooling": pooling} if pooling else None
    latencies: list[float] = []
    in_engine: list[float] = []  # the server's own account: embed call to vectors
    tokenizing: list[float] = []  # the part of it until the last text was queued
    decode_s: list[float] = []  # the client's own, from the response read to its rows
    tokens = 0
    pending = list(reversed(batches))

    async def worker() -> None:
        nonlocal tokens
        while pending:
            batch = pending.pop()
            sent = time.perf_counter()
            raw = await client.embeddings.with_raw_response.create(
                model=model, input=batch, extra_body=extra, **asked
            )
            answered = time.perf_counter()
            if decoding == "body":
                body = orjson.loads(raw.http_response.content)
                rows: list[Any] = [np.frombuffer(base64.b64decode(d["embedding"]), np.float32)
                        for d in body["data"]]  # fmt: skip
                used = body["usage"]["total_tokens"]
            else:
                response = raw.parse()
                rows = [d.embedding for d in response.data]
                if decoding == "numpy":
                    rows = [np.frombuffer(base64.b64decode(row), np.float32) for row in rows]
                used = response.usage.total_tokens
            done = time.perf_counter()
            latencies.append(done - sent)
            decode_s.append(done - answered)
            in_engine.append(float(raw.headers["x-total-time"]) / 1000)
            tokenizing.append(float(raw.headers["x-tokenization-time"]) / 1000)
            assert len(rows) == len(batch)
            tokens += used

    await asyncio.gather(*(worker() for _ in range(clients)))
    await client.close()
    return latencies, in_engine, tokenizing, decode_s, tokens


class Outcome(NamedTuple):
    """One client process's pass."""

    latencies: list[float]
    in_engine: list[float]
    tokenizing: list[float]
    decoding: list[float]
    tokens: int
    cpu_s: float


def run_client_process(job: tuple[str, str, str | None, list[list[str]], int, str]) -> Outcome:
    import uvloop

    cpu = time.process_time()
    latencies, in_engine, tokenizing, decoding, tokens = uvloop.run(client_process(*job))
    return Outcome(latencies, in_engine, tokenizing, decoding, tokens, time.process_time() - cpu)


def pin_cores(cores: set[int] | None) -> None:
    if cores:
        os.sched_setaffinity(0, cores)


def parse_cores(text: str) -> set[int]:
    """`taskset -c` syntax: 0-15,32,40-47."""
    cores: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def threads_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """Each of a process's threads: its name and CPU seconds so far; the thread that runs
    the event loop (the first one) is "main"."""
    ticks = os.sysconf("SC_CLK_TCK")
    threads: dict[int, tuple[str, float]] = {}
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # utime, stime: fields 14, 15
        threads[tid] = ("main" if tid == pid else name, (int(fields[11]) + int(fields[12])) / ticks)
    return threads


def threads_busy(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], seconds: float
) -> dict[str, float]:
    """Cores the threads of each name kept busy between two readings (`threads_cpu_s`),
    busiest first: a thread started between them counts from 0, one that ended not at all."""
    busy: dict[str, float] = {}
    for tid, (name, spent) in after.items():
        busy[name] = busy.get(name, 0.0) + (spent - before.get(tid, (name, 0.0))[1]) / seconds
    return dict(sorted(busy.items(), key=lambda kv: -kv[1]))


def busy_cores(cores: set[int]) -> dict[int, tuple[int, int]]:
    """(busy, total) jiffies so far of each of `cores`, from /proc/stat."""
    counts = {}
    for row in Path("/proc/stat").read_text().splitlines():
        name, *fields = row.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            values = [int(v) for v in fields]
            idle = values[3] + values[4]  # idle and iowait
            counts[int(name[3:])] = (sum(values[:8]) - idle, sum(values[:8]))
    return counts


def _cpu_change(
    before: tuple[dict[int, tuple[str, float]], dict[int, tuple[int, int]]],
    after: tuple[dict[int, tuple[str, float]], dict[int, tuple[int, int]]],
    seconds: float,
) -> dict[str, Any]:
    """The server's threads' CPU over a pass, as cores kept busy, and how busy the server's
    cores were (from anyone, clients included when they share them)."""
    threads = {
        name: round(cores, 2)
        for name, cores in threads_busy(before[0], after[0], seconds).items()
        if cores > 0
    }
    busy = sum(after[1][c][0] - before[1][c][0] for c in after[1])
    total = sum(after[1][c][1] - before[1][c][1] for c in after[1])
    return {
        "server_threads_cores": threads,
        "server_cores_busy_fraction": round(busy / max(1, total), 3),
    }


def drive(
    base_url: str,
    model: str,
    pooling: str | None,
    batches: list[list[str]],
    clients: int,
    processes: int,
    decoding: str,
    passes: int,
    server_pid: int,
    server_cores: set[int],
    client_cores: set[int] | None,
    py_spy: str | None,
    spy_flags: list[str],
) -> dict[str, Any]:
    """`clients` concurrent requests spread over `processes` client processes: decoding the
    responses (the SDK turns each row into Python floats) takes one process's full time long
    before a fast server is busy. One untimed pass over every request warms the server, as
    the library is warmed; then the median of `passes` timed ones."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    texts = sum(map(len, batches))
    shares = [batches[i::processes] for i in range(processes)]
    per_process = [clients // processes + (i < clients % processes) for i in range(processes)]
    jobs = [
        (base_url, model, pooling, share, n, decoding)
        for share, n in zip(shares, per_process, strict=True)
    ]
    context = multiprocessing.get_context("spawn")
    runs = []
    with ProcessPoolExecutor(
        processes, mp_context=context, initializer=pin_cores, initargs=(client_cores,)
    ) as pool:
        list(pool.map(run_client_process, jobs))  # warm-up: processes up, server warm
        # the server's stacks over the timed passes only
        recorder = record_stacks(server_pid, py_spy, spy_flags) if py_spy else None
        for _ in range(passes):
            before = _counters(base_url)
            cpu_before = threads_cpu_s(server_pid), busy_cores(server_cores)
            started = time.perf_counter()
            outcomes = list(pool.map(run_client_process, jobs))
            seconds = time.perf_counter() - started
            cpu_after = threads_cpu_s(server_pid), busy_cores(server_cores)
            figures = _pass_figures(outcomes, seconds)
            figures["devices"] = _counter_change(before, _counters(base_url), seconds)
            figures["cpu"] = _cpu_change(cpu_before, cpu_after, seconds)
            figures["cpu"]["clients_cores"] = round(sum(o.cpu_s for o in outcomes) / seconds, 2)
            main_s = cpu_after[0][server_pid][1] - cpu_before[0][server_pid][1]
            figures["cpu"]["main_thread_us_per_text"] = round(1e6 * main_s / texts, 1)
            runs.append(figures)
        stop_recording(recorder)
    # The rate from the median of the passes' seconds, as the library's: the same statistic
    # on both sides of the ratio (with two passes, the middle pass alone is the slower one).
    # Latencies and where the time went are the middle pass's.
    middle = sorted(runs, key=lambda run: run["seconds"])[len(runs) // 2]
    seconds = statistics.median(run["seconds"] for run in runs)
    return {
        **middle,
        "seconds": seconds,
        "requests_per_s": middle["requests"] / seconds,
        "tokens_per_s": middle["tokens"] / seconds,
        "runs_s": [round(run["seconds"], 4) for run in runs],
        "peak_rss_bytes": peak_rss_bytes(server_pid),
    }


def peak_rss_bytes(pid: int) -> int:
    """The most resident memory the process has held so far (VmHWM)."""
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def launch_figures(launching_s: float, batches: int, seconds: float) -> dict[str, float]:
    """The mean launch and the share of `seconds` the event loop spent launching: a launch
    waits for the interpreter lock at each torch call while another thread holds it."""
    return {
        "mean_launch_ms": round(1000 * launching_s / max(1, batches), 2),
        "launching_fraction": round(launching_s / seconds, 3),
    }


def _counters(base_url: str) -> dict[str, dict[str, float]]:
    """Each device's batches, tokens and busy seconds so far, and the tokenizer's calls,
    texts, busy seconds and seconds taking ids out, from the server's /info."""
    import httpx

    info = httpx.get(base_url.removesuffix("/v1") + "/info", timeout=10).json()
    counters = {
        "tokenizer": {
            "calls": 0, "texts": 0, "busy_s": 0.0, "collect_s": 0.0, "idle_s": 0.0, "free_s": 0.0,
        }
    }  # fmt: skip
    for model in info["models"]:
        for device in model.get("devices", []):
            keys = ("batches", "tokens", "busy_s", "launching_s")
            counters[device["device"]] = {k: device[k] for k in keys}
        tokenizer = model.get("tokenizer", {})
        for key in counters["tokenizer"]:  # /info shows settings there too: sum only these
            counters["tokenizer"][key] += tokenizer.get(key, 0)
    return counters


def _counter_change(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], seconds: float
) -> dict[str, dict[str, float]]:
    """Over one pass, per device: batches, mean tokens a batch, and the share of the pass
    its batches kept it busy (low with requests waiting means the host did not feed it);
    for the tokenizer: calls, mean texts a call, the share of the pass a call ran, and the
    share its ids were being taken out."""
    change = {}
    for name, now in after.items():
        was = before[name]
        if name == "tokenizer":
            calls = now["calls"] - was["calls"]
            texts = now["texts"] - was["texts"]
            change[name] = {
                "calls": calls,
                "mean_call_texts": round(texts / max(1, calls)),
                "collect_fraction": round((now["collect_s"] - was["collect_s"]) / seconds, 3),
                # the tokenizer's thread waiting for texts, and freeing encodings
                "idle_fraction": round((now["idle_s"] - was["idle_s"]) / seconds, 3),
                "free_fraction": round((now["free_s"] - was["free_s"]) / seconds, 3),
            }
        else:
            batches = now["batches"] - was["batches"]
            tokens = now["tokens"] - was["tokens"]
            change[name] = {
                "batches": batches,
                "mean_batch_tokens": round(tokens / max(1, batches)),
                **launch_figures(now["launching_s"] - was["launching_s"], int(batches), seconds),
            }
        change[name]["busy_fraction"] = round((now["busy_s"] - was["busy_s"]) / seconds, 3)
    return change


def _pass_figures(outcomes: list[Outcome], seconds: float) -> dict[str, Any]:
    latencies = sorted(x for outcome in outcomes for x in outcome.latencies)
    in_engine = [x for outcome in outcomes for x in outcome.in_engine]
    tokenizing = [x for outcome in outcomes for x in outcome.tokenizing]
    decoding = [x for outcome in outcomes for x in outcome.decoding]
    tokens = sum(outcome.tokens for outcome in outcomes)
    return {
        "requests": len(latencies),
        "seconds": seconds,
        "requests_per_s": len(latencies) / seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "latency_p50_s": statistics.median(latencies),
        "latency_p99_s": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        # x-total-time: from the engine's embed call to the vectors; the rest of a
        # request's latency is HTTP, JSON, admission and the client's decoding
        "in_engine_p50_s": statistics.median(in_engine),
        "tokenizing_p50_s": statistics.median(tokenizing),  # x-tokenization-time
        # the client's own share: from the body read to its rows, with no await between
        "client_decoding_p50_s": statistics.median(decoding),
    }


def start_server(port: int, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "EMBEDX_HOST": "127.0.0.1",
        "EMBEDX_PORT": str(port),
        "EMBEDX_MAX_BATCH_TOKENS": str(args.max_batch_tokens),
        # every client's request admitted: --clients is what is measured
        "EMBEDX_MAX_INPUTS_IN_FLIGHT": str(args.clients * args.batch),
        "EMBEDX_LOG_LEVEL": "warning",
        # a random shape is a directory the requests name by its path (127.0.0.1 only)
        "EMBEDX_ALLOW_LOCAL_PATHS": "true",
    }
    server = subprocess.Popen([sys.executable, "-m", "embedx", "serve"], env=env)
    wait_up(f"http://127.0.0.1:{port}", server, 120)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=MINILM, help="a catalog name or a random shape")
    parser.add_argument("--clients", type=int, default=32, help="requests in flight")
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256, help="texts per request")
    parser.add_argument(
        "--requests",
        type=int,
        default=1600,
        help="requests a pass: as the first ones start and the last ones finish, fewer are in "
        "flight, so a short pass counts that ramp and tail for more of its time",
    )
    parser.add_argument("--passes", type=int, default=3, help="timed passes each; medians count")
    parser.add_argument(
        "--corpus", nargs="+", default=list(DEFAULT_CORPUS), metavar="PATH", help=CORPUS_HELP
    )
    parser.add_argument("--max-batch-tokens", type=int, default=262144)
    parser.add_argument("--tiny", action="store_true", help="tiny random shapes (host overhead)")
    parser.add_argument(
        "--decoding",
        choices=list(DECODINGS),
        default="sdk",
        help="how the clients read a response (see DECODINGS)",
    )
    parser.add_argument(
        "--server-cores", type=parse_cores, help="cores for the library and the server: 0-15"
    )
    parser.add_argument(
        "--client-cores", type=parse_cores, help="cores for the clients (default: anywhere)"
    )
    parser.add_argument(
        "--py-spy",
        metavar="PREFIX",
        help="record the stacks of the library and the server over their timed passes, in "
        "PREFIX-library.txt and PREFIX-server.txt",
    )
    parser.add_argument(
        "--native", action="store_true", help="with --py-spy: C and Rust frames too"
    )
    parser.add_argument(
        "--gil",
        action="store_true",
        help="with --py-spy: only the thread holding the interpreter lock, sampled (a thread's "
        "share of the samples is its share of the time holding it)",
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    pin_cores(args.server_cores)  # the library runs here; the server inherits it
    server_cores = os.sched_getaffinity(0)
    texts = repeated_texts(args.corpus, args.requests * args.batch)
    batches = [texts[i : i + args.batch] for i in range(0, len(texts), args.batch)]
    with tempfile.TemporaryDirectory() as workdir:
        model, pooling = args.model, None
        if args.model != MINILM:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
            directory, pooling, _ = model_directory(args.model, Path(workdir), args.tiny, device)
            model = str(directory)
        library = asyncio.run(
            library_rate(
                model,
                pooling,
                texts,
                args.max_batch_tokens,
                args.passes,
                args.py_spy and f"{args.py_spy}-library.txt",
                py_spy_flags(args.native, args.gil),
            )
        )
        port = free_port()
        server = start_server(port, args)
        try:
            processes = min(args.client_processes, args.clients)
            url = f"http://127.0.0.1:{port}/v1"
            served = drive(
                url,
                model,
                pooling,
                batches,
                args.clients,
                processes,
                args.decoding,
                args.passes,
                server.pid,
                server_cores,
                args.client_cores,
                args.py_spy and f"{args.py_spy}-server.txt",
                py_spy_flags(args.native, args.gil),
            )
        finally:
            server.terminate()
            server.wait(60)
    result = {
        "benchmark": "load",
        "model": args.model,
        "clients": args.clients,
        "client_processes": min(args.client_processes, args.clients),
        "texts_per_request": args.batch,
        "encoding_format": "base64",
        "decoded_by": DECODINGS[args.decoding],
        "server_cores": len(server_cores),
        "client_cores": len(args.client_cores) if args.client_cores else "shared",
        "library": library,
        "server": served,
        "server_vs_library": served["tokens_per_s"] / library["tokens_per_s"],
        "environment": environment(),
    }
    write_json(result, args.out)


if __name__ == "__main__":
    main()
