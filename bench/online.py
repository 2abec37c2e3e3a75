"""Small requests from many clients: requests/s and p50/p99 latency of short texts sent a few at
a time, embedx's server against infinity's in the same run.

    python bench/online.py [MODEL] [--sizes 1 8] [--clients 1 16 64 256] [--seconds 5]
                           [--server-cores 0-11 --client-cores 12-15]
                           [--infinity-site DIR] [--out FILE]

MODEL as bench/throughput.py takes it (default `minilm`; `--tiny` random shapes for a CPU
smoke run). Texts are --words words of the corpus each (15 words: about 20 tokens). For each
size (texts a request) and client count, client processes on --client-cores hold that many
keep-alive connections to 127.0.0.1, each sending one request after another (a raw HTTP/1.1
client on uvloop: an SDK's own cost would be most of what is measured). After --warmup
seconds, --seconds count: requests/s, and p50/p99 of the requests that started within them,
and the server's CPU time a request (/proc, Linux): its main thread's (the event loop, which
limits a server of many small requests) and its whole process's; and the share of the
window each of its threads was busy, by name (`main`: the loop; a thread another starts, a
tokenizer's or torch's worker, carries its starter's name).
Then bulk: --bulk-texts texts a request from --bulk-clients clients against the same server
(default settings), in tokens/s, against the library (`Engine.embed` of all the texts at once)
at --library-batch-tokens, its best budget, on the server's cores once the server is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, cast

import orjson
from common import (
    CORPUS_HELP,
    DEFAULT_CORPUS,
    environment,
    fast_tokenizer,
    load_corpus,
    wait_up,
    write_json,
)
from load import (
    free_port,
    library_rate,
    parse_cores,
    pin_cores,
    repeated_texts,
    threads_busy,
    threads_cpu_s,
)
from throughput import model_directory

MODEL_NAME = "bench"
INFINITY_VERSION = "0.0.78"


def short_texts(corpus: list[str], words: int, count: int) -> list[str]:
    """`count` texts of `words` words each, cut from the corpus in order."""
    texts: list[str] = []
    for text in corpus:
        split = text.split()
        for start in range(0, len(split) - words + 1, words):
            texts.append(" ".join(split[start : start + words]))
            if len(texts) == count:
                return texts
    if not texts:
        raise SystemExit(f"no text of the corpus has {words} words")
    return (texts * -(-count // len(texts)))[:count]


def http_requests(path: str, bodies: list[dict[str, Any]]) -> list[bytes]:
    """Each body as the bytes of one HTTP/1.1 request."""
    requests = []
    for body in bodies:
        data = orjson.dumps(body)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        requests.append(head.encode() + data)
    return requests


class _Connection(asyncio.Protocol):
    """One keep-alive connection: a request written, its whole response read (Content-Length
    bodies: both servers send them)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        field = head.find(b"\r\ncontent-length:")
        if field < 0:
            raise SystemExit(f"a response without Content-Length: {head[:200]!r}")
        stop = head.find(b"\r\n", field + 2)
        length = int(head[field + 17 : stop if stop > 0 else len(head)])
        if len(self.buffer) < end + 4 + length:
            return
        del self.buffer[: end + 4 + length]
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(int(head[9:12]))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("the server closed the connection"))

    async def send(self, request: bytes) -> int:
        """The response's status."""
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.waiter


class Share(NamedTuple):
    """What one client process saw in the timed window."""

    completed: int  # requests that finished within it
    latencies: list[float]  # of the requests that started within it
    errors: int


def _client_process(job: tuple[int, list[bytes], int, float, float, set[int] | None]) -> Share:
    import uvloop

    port, requests, connections, warmup_s, seconds, cores = job
    pin_cores(cores)

    async def run() -> Share:
        loop = asyncio.get_running_loop()
        opened = [
            await loop.create_connection(_Connection, "127.0.0.1", port) for _ in range(connections)
        ]
        begin = time.perf_counter() + warmup_s
        end = begin + seconds
        latencies: list[float] = []
        completed = errors = 0

        async def client(connection: _Connection, first: int) -> None:
            nonlocal completed, errors
            turn = first
            while (started := time.perf_counter()) < end:
                status = await connection.send(requests[turn % len(requests)])
                turn += connections
                finished = time.perf_counter()
                if status != 200:
                    errors += 1
                if begin <= started:
                    latencies.append(finished - started)
                if begin <= finished <= end:
                    completed += 1

        await asyncio.gather(*(client(c, i) for i, (_, c) in enumerate(opened)))
        for transport, _ in opened:
            transport.close()
        return Share(completed, latencies, errors)

    return uvloop.run(run())


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) a process has used so far, its ended threads' too."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # fields 14, 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(
    port: int,
    requests: list[bytes],
    clients: int,
    processes: int,
    warmup_s: float,
    seconds: float,
    cores: set[int] | None,
    server: int,
) -> dict[str, Any]:
    """`clients` connections over `processes` processes, for warm-up and then `seconds`; the
    `server` process's CPU read as the timed seconds begin and end."""
    processes = min(processes, clients)
    counts = [clients // processes + (i < clients % processes) for i in range(processes)]
    jobs = [
        (port, requests[i::processes], n, warmup_s, seconds, cores) for i, n in enumerate(counts)
    ]
    cpu: list[tuple[float, dict[int, tuple[str, float]]]] = []

    def read_cpu() -> None:
        cpu.append((cpu_seconds(server), threads_cpu_s(server)))

    timers = [threading.Timer(at, read_cpu) for at in (warmup_s, warmup_s + seconds)]
    with ProcessPoolExecutor(processes) as pool:
        for timer in timers:
            timer.start()
        shares = list(pool.map(_client_process, jobs))
    for timer in timers:
        timer.join()
    latencies = sorted(t for share in shares for t in share.latencies)
    errors = sum(share.errors for share in shares)
    if errors or not latencies:
        raise SystemExit(f"{errors} of the requests failed; {len(latencies)} answered")
    completed = sum(share.completed for share in shares)
    (all_0, threads_0), (all_1, threads_1) = cpu
    loop_s = threads_1[server][1] - threads_0[server][1]  # the event loop's thread
    # each thread's share of the window busy, by name: one near 1 is what limits
    busy = threads_busy(threads_0, threads_1, seconds)

    def per_request(cpu_s: float) -> float | None:  # None: none finished within the window
        return round(1e6 * cpu_s / completed, 1) if completed else None

    p50_s = statistics.median(latencies)
    if p50_s > seconds:  # most requests outlive the window: its count undersells the rate
        print(f"warning: p50 latency {p50_s:.1f} s is longer than the {seconds} s timed: "
              "raise --seconds for this point", file=sys.stderr, flush=True)  # fmt: skip
    return {
        "clients": clients,
        "requests_per_s": round(completed / seconds, 1),
        "window_covers_p50": p50_s <= seconds,
        "p50_ms": round(1e3 * p50_s, 3),
        "p99_ms": round(1e3 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3),
        "requests": len(latencies),
        "server_main_thread_us_per_request": per_request(loop_s),
        "server_cpu_us_per_request": per_request(all_1 - all_0),
        "server_threads_busy": {name: round(cores, 3) for name, cores in list(busy.items())[:6]},
    }


def measure(
    name: str,
    server: subprocess.Popen[bytes],
    port: int,
    path: str,
    body: Any,
    texts: list[str],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """Every (size, clients) point against one server, as `body(texts)` shapes a request."""
    points = []
    for size in args.sizes:
        groups = [texts[i : i + size] for i in range(0, len(texts) - size + 1, size)]
        requests = http_requests(path, [body(group) for group in groups])
        for clients in args.clients:
            point = drive(
                port, requests, clients, args.client_processes, args.warmup, args.seconds,
                args.client_cores, server.pid,
            )  # fmt: skip
            point["texts_per_request"] = size
            print(name, point, flush=True)
            points.append(point)
    return points


def serve(command: list[str], env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(command, env=env)
    wait_up(f"http://127.0.0.1:{port}", server)
    return server


def run_embedx(
    directory: Path,
    pooling: str,
    length: int,
    texts: list[str],
    bulk_texts: list[str],
    args: argparse.Namespace,
) -> Any:
    port = free_port()
    models = args.workdir / "models.toml"
    models.write_text(f'[models.{MODEL_NAME}]\nsource = "{directory}"\npooling = "{pooling}"\n')
    env = {
        **os.environ,
        "EMBEDX_HOST": "127.0.0.1",
        "EMBEDX_PORT": str(port),
        "EMBEDX_MODELS_FILE": str(models),
        "EMBEDX_PRELOAD": MODEL_NAME,
        "EMBEDX_LOG_LEVEL": "warning",
    }  # default limits: what a user gets
    server = serve([*args.server_taskset, sys.executable, "-m", "embedx", "serve"], env, port)
    try:
        points = measure(
            "embedx", server, port, "/v1/embeddings",
            lambda group: {"model": MODEL_NAME, "input": group, "encoding_format": "float"},
            texts, args,
        )  # fmt: skip
        bulk = None
        if bulk_texts:
            bulk = measure_bulk(server, port, bulk_texts, directory, length, args)
    finally:
        server.terminate()
        server.wait(60)
    return points, bulk


def measure_bulk(
    server: subprocess.Popen[bytes],
    port: int,
    texts: list[str],
    directory: Path,
    length: int,
    args: argparse.Namespace,
) -> Any:
    """Requests of --bulk-texts of `texts` each from --bulk-clients clients: tokens/s."""
    size = args.bulk_texts
    groups = [texts[i : i + size] for i in range(0, len(texts), size)]
    body = {"model": MODEL_NAME, "encoding_format": "base64"}
    requests = http_requests("/v1/embeddings", [{**body, "input": group} for group in groups])
    encoded = fast_tokenizer(directory, length).encode_batch(texts)
    tokens_per_request = sum(len(e.ids) for e in encoded) / len(groups)
    point = drive(
        port, requests, args.bulk_clients, args.client_processes, args.warmup, args.seconds,
        args.client_cores, server.pid,
    )  # fmt: skip
    point["texts_per_request"] = size
    point["tokens_per_s"] = round(point["requests_per_s"] * tokens_per_request)
    print("embedx bulk", point, flush=True)
    return point


def library_bulk(
    directory: Path, pooling: str, texts: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """The library on the bulk texts, at its best budget, on the server's cores."""
    if args.server_cores:
        os.sched_setaffinity(0, parse_cores(args.server_cores))
    rate = asyncio.run(
        library_rate(str(directory), pooling, texts, args.library_batch_tokens, 2, None, [])
    )
    print("library bulk", round(rate["tokens_per_s"]), "tok/s", flush=True)
    return {
        "max_batch_tokens": args.library_batch_tokens,
        "tokens_per_s": round(rate["tokens_per_s"]),
    }


def run_infinity(directory: Path, device: str, texts: list[str], args: argparse.Namespace) -> Any:
    port = free_port()
    site = str(Path(args.infinity_site).resolve())
    env = {**os.environ, "PYTHONPATH": site, "INFINITY_ANONYMOUS_USAGE_STATS": "0",
           "DO_NOT_TRACK": "1"}  # fmt: skip
    command = [*args.server_taskset, sys.executable, "-m", "infinity_emb.cli", "v2",
               "--model-id", str(directory), "--engine", "torch", "--device", device,
               "--port", str(port)]  # fmt: skip
    server = serve(command, env, port)
    try:
        return measure(
            "infinity", server, port, "/embeddings",
            lambda group: {"model": str(directory), "input": group, "encoding_format": "float"},
            texts, args,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(60)


def _ratios(methods: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """embedx's requests/s over infinity's at each point."""
    if "infinity" not in methods:
        return []
    return [
        {"texts_per_request": ours["texts_per_request"], "clients": ours["clients"],
         "requests_per_s": round(ours["requests_per_s"] / theirs["requests_per_s"], 2)}
        for ours, theirs in zip(methods["embedx"], methods["infinity"], strict=True)
    ]  # fmt: skip


def _bulk_figures(server: dict[str, Any] | None, library: dict[str, Any] | None) -> Any:
    if server is None or library is None:
        return None
    ratio = round(server["tokens_per_s"] / library["tokens_per_s"], 3)
    return {"server": server, "library": library, "server_over_library": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="minilm")
    parser.add_argument("--tiny", action="store_true", help="tiny random shapes (CPU smoke run)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8], help="texts a request")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--words", type=int, default=15, help="words a text")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before timing")
    parser.add_argument("--seconds", type=float, default=5.0, help="timed seconds a point")
    parser.add_argument("--corpus", nargs="+", default=list(DEFAULT_CORPUS), help=CORPUS_HELP)
    parser.add_argument("--server-cores", default="", help="taskset cores for the servers")
    parser.add_argument("--client-cores", type=parse_cores, help="cores for the clients")
    parser.add_argument("--infinity-site", help="a folder holding infinity-emb and its needs")
    parser.add_argument("--bulk-texts", type=int, default=256, help="texts a bulk request")
    parser.add_argument("--bulk-clients", type=int, default=64, help="0: no bulk point")
    parser.add_argument("--library-batch-tokens", type=int, default=262144)
    parser.add_argument("--out")
    args = parser.parse_args()
    args.server_taskset = ["taskset", "-c", args.server_cores] if args.server_cores else []

    import torch

    texts = short_texts(load_corpus(args.corpus, repeat=1), args.words, 4096)
    bulk_texts = repeated_texts(args.corpus, args.bulk_texts * 256) if args.bulk_clients else []
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = Path(workdir)
        directory, pooling, length = model_directory(args.model, args.workdir, args.tiny, device)
        lengths = [len(e.ids) for e in fast_tokenizer(directory, length).encode_batch(texts)]
        points, bulk = run_embedx(directory, pooling, length, texts, bulk_texts, args)
        methods = {"embedx": points}
        if args.infinity_site:
            methods["infinity"] = run_infinity(directory, device, texts, args)
        library = library_bulk(directory, pooling, bulk_texts, args) if bulk else None
    result = {
        "benchmark": "online",
        "model": args.model,
        "tokens_per_text": statistics.median(lengths),
        "seconds_per_point": args.seconds,
        "server_cores": args.server_cores or "any",
        "client_cores": sorted(args.client_cores) if args.client_cores else "any",
        "methods": methods,
        "embedx_over_infinity": _ratios(methods),
        "bulk": _bulk_figures(bulk, library),
        "infinity_version": INFINITY_VERSION if args.infinity_site else None,
        "environment": environment(),
    }
    write_json(result, args.out)


if __name__ == "__main__":
    main()
