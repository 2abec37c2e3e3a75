"""Abusive clients against the real server on 127.0.0.1: a long text with no spaces, bodies
sent slowly, large bodies all at once.

    python bench/abuse.py [--points 1 3 4] [--text-mb 5 30] [--slow-clients 1100]
                          [--bodies 16 64] [--body-mb 30] [--tree PATH] [--out FILE]

It speaks HTTP only, so it measures any commit: --tree runs the server of another checkout
(`git worktree add /tmp/before <commit>`). Each point gets a fresh `embedx serve` with
all-MiniLM-L6-v2 preloaded and every other setting at its default, on a free loopback port.
Every wait is bounded; what did not come in time is reported as such. JSON out:

1. a request of one text of N MB of CJK characters, no spaces: its seconds and status, the
   latencies of one-text requests sent one after another meanwhile, and the server's RSS
   before, at its peak and after;
3. N sockets that send their headers and 9 bytes of a 1,000-byte body, then nothing: the
   latencies of one-text requests meanwhile, what the slow sockets got within SLOW_WAIT_S;
   then, with N fresh ones open, the seconds a SIGTERM takes to end the server;
4. N bodies of M MB at once (16 texts, the rest JSON whitespace: bytes to read and parse and
   little for the model to do): how they were answered, in how long, the latencies of
   one-text requests sent one after another meanwhile, and the server's RSS before, at its
   peak and after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson
from common import environment, write_json

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
ROOT = Path(__file__).resolve().parent.parent
SLOW_HEAD = (
    b"POST /v1/embeddings HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    b'Content-Length: 1000\r\n\r\n{"input":'
)
SLOW_WAIT_S = 30.0  # for the slow sockets' answers: six times EMBEDX_BODY_TIMEOUT_S's default
PROBE_TIMEOUT_S = 10.0  # a one-text request that takes longer is counted as locked out
REQUEST_TIMEOUT_S = 600.0
T = TypeVar("T")


class Server:
    """`embedx serve` of a checkout, in its own process on a free loopback port."""

    def __init__(self, tree: Path, log: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDX_")}
        env.update(
            HF_HUB_OFFLINE="1",
            PYTHONPATH=str(tree),  # before the virtualenv's own checkout
            EMBEDX_HOST="127.0.0.1",
            EMBEDX_PORT=str(self.port),
            EMBEDX_PRELOAD=MINILM,
            EMBEDX_LOG_LEVEL="warning",
        )
        command = [sys.executable, "-m", "embedx", "serve"]
        with open(log, "ab") as sink:
            self.process = subprocess.Popen(
                command, cwd=tree, env=env, stdout=sink, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.process.poll() is None:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        self.process.kill()
        raise SystemExit(f"the server did not come up within 180 s (its log: {log})")

    def memory(self, field: str) -> int:
        """VmRSS (now) or VmHWM (the peak since `reset_peak`), in bytes."""
        for row in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if row.startswith(field + ":"):
                return int(row.split()[1]) * 1024
        raise RuntimeError(f"no {field} for the server")

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")  # VmHWM from now on

    def stop(self) -> float | None:
        """SIGTERM; the seconds until the process ended (killed after 120 s: then None)."""
        signalled = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None
        return time.monotonic() - signalled


@contextlib.contextmanager
def serving(tree: Path, log: Path) -> Iterator[Server]:
    server = Server(tree, log)
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.stop()


def embed(server: Server, body: bytes, timeout: float) -> tuple[float, int | str, bytes]:
    """Seconds, status (or the transport error's name) and body of one request."""
    started = time.perf_counter()
    try:
        response = httpx.post(server.url + "/v1/embeddings", content=body, timeout=timeout,
                              headers={"content-type": "application/json"})  # fmt: skip
    except httpx.TransportError as error:
        return time.perf_counter() - started, type(error).__name__, b""
    return time.perf_counter() - started, response.status_code, response.content


ONE_TEXT = orjson.dumps({"model": MINILM, "input": "a short request beside the others"})


def probe_latencies(server: Server, until: threading.Event, most: int) -> dict[str, Any]:
    """One-text requests one after another until `until` is set (`most` at most)."""
    seconds: list[float] = []
    failed: Counter[str] = Counter()
    while not until.is_set() and len(seconds) + sum(failed.values()) < most:
        took, status, _ = embed(server, ONE_TEXT, PROBE_TIMEOUT_S)
        if status == 200:
            seconds.append(took)
        else:
            failed[str(status)] += 1
    return {
        "answered": len(seconds),
        "failed": dict(failed),
        "median_s": round(statistics.median(seconds), 4) if seconds else None,
        "max_s": round(max(seconds), 4) if seconds else None,
    }


@contextlib.contextmanager
def probing(server: Server) -> Iterator[dict[str, Any]]:
    """One-text requests one after another while the block runs; their figures fill the dict
    it is given once it ends."""
    done = threading.Event()
    figures: dict[str, Any] = {}
    prober = threading.Thread(target=lambda: figures.update(probe_latencies(server, done, 10_000)))
    prober.start()
    try:
        yield figures
    finally:
        done.set()
        prober.join()


def cjk_text(megabytes: float, seed: int = 0) -> str:
    """Random CJK ideographs, no spaces: 3 bytes each in UTF-8."""
    rng = random.Random(seed)
    return "".join(chr(rng.randrange(0x4E00, 0x9FA6)) for _ in range(int(megabytes * 1e6 / 3)))


def long_text(tree: Path, log: Path, megabytes: float) -> dict[str, Any]:
    body = orjson.dumps({"model": MINILM, "input": cjk_text(megabytes)})
    with serving(tree, log) as server:
        embed(server, ONE_TEXT, 60)  # warm
        before = server.memory("VmRSS")
        server.reset_peak()
        with probing(server) as probes:
            took, status, _ = embed(server, body, REQUEST_TIMEOUT_S)
        return {
            "text_mb": megabytes,
            "body_bytes": len(body),
            "seconds": round(took, 3),
            "status": status,
            "one_text_requests_meanwhile": probes,
            "rss_mb": _rss(before, server.memory("VmHWM"), server.memory("VmRSS")),
        }


def _rss(before: int, peak: int, after: int) -> dict[str, float]:
    return {"before": round(before / 1e6), "peak": round(peak / 1e6), "after": round(after / 1e6)}


def open_slow(server: Server, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(SLOW_HEAD)
        sockets.append(sock)
    return sockets


def answers(sockets: list[socket.socket], wait_s: float) -> tuple[Counter[str], float | None]:
    """What each socket got within `wait_s` (the status of its answer, "closed" for an end
    with none, "nothing"), and the seconds until the last of them got it."""
    got: dict[int, str] = {}
    by_fd = {sock.fileno(): sock for sock in sockets}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    started = time.monotonic()
    last = None
    while len(got) < len(sockets) and (left := started + wait_s - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000):
            try:
                head = by_fd[fd].recv(64)
            except OSError as error:  # reset
                head, got[fd] = b"", type(error).__name__
            if fd not in got:
                got[fd] = head.split(b" ")[1].decode() if head.startswith(b"HTTP/") else "closed"
            poller.unregister(fd)
            last = time.monotonic() - started
    return Counter(got.values()) + Counter(nothing=len(sockets) - len(got)), last


def slow_bodies(tree: Path, log: Path, count: int) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 1024)), hard))
    with serving(tree, log) as server:
        embed(server, ONE_TEXT, 60)  # warm
        opened = time.monotonic()
        slow = open_slow(server, count)
        opening_s = time.monotonic() - opened
        meanwhile = probe_latencies(server, threading.Event(), 5)
        got, last_s = answers(slow, SLOW_WAIT_S)
        for sock in slow:
            sock.close()
        held = open_slow(server, count)  # to see whether they hold the stop
        stop_s = server.stop()
        at_stop, _ = answers(held, 10)
        for sock in held:
            sock.close()
    return {
        "slow_sockets": count,
        "opening_s": round(opening_s, 2),
        "one_text_requests_meanwhile": meanwhile,
        f"slow_sockets_answers_within_{SLOW_WAIT_S:g}_s": dict(got),
        "last_answer_s": round(last_s, 2) if last_s is not None else None,
        "sigterm_to_exit_s": round(stop_s, 2) if stop_s is not None else None,
        "slow_sockets_answers_at_stop": dict(at_stop),
    }


def at_once(count: int, request: Callable[[], T]) -> list[T]:
    """`count` calls of `request`, from as many threads started together."""
    start = threading.Barrier(count)
    results: list[T] = []

    def call() -> None:
        start.wait()
        results.append(request())

    threads = [threading.Thread(target=call) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def large_bodies(
    tree: Path, log: Path, counts: list[int], megabytes: float
) -> list[dict[str, Any]]:
    texts = [f"text {i} of a large body, the rest of which is whitespace" for i in range(16)]
    request = orjson.dumps({"model": MINILM, "input": texts})
    body = request[:-1] + b" " * (int(megabytes * 1e6) - len(request)) + b"}"
    results = []
    with serving(tree, log) as server:
        embed(server, ONE_TEXT, 60)  # warm
        for count in counts:
            before = server.memory("VmRSS")
            server.reset_peak()
            started = time.perf_counter()
            with probing(server) as probes:
                outcomes = at_once(count, lambda: embed(server, body, REQUEST_TIMEOUT_S))
            seconds = time.perf_counter() - started
            whole = sum(
                status == 200 and len(orjson.loads(content)["data"]) == len(texts)
                for _, status, content in outcomes
            )
            results.append({
                "bodies": count,
                "body_bytes": len(body),
                "statuses": dict(Counter(str(status) for _, status, _ in outcomes)),
                "answered_with_every_vector": whole,
                "seconds": round(seconds, 2),
                "slowest_s": round(max(took for took, _, _ in outcomes), 2),
                "one_text_requests_meanwhile": probes,
                "rss_mb": _rss(before, server.memory("VmHWM"), server.memory("VmRSS")),
            })  # fmt: skip
    return results


def commit(tree: Path) -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
        return done.stdout.strip()

    changed = "+changes" if git("status", "--porcelain") else ""
    return git("rev-parse", "--short", "HEAD") + changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", nargs="+", type=int, choices=[1, 3, 4], default=[1, 3, 4])
    parser.add_argument("--text-mb", nargs="+", type=float, default=[5, 30])
    parser.add_argument("--slow-clients", type=int, default=1100)
    parser.add_argument("--bodies", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--body-mb", type=float, default=30)
    parser.add_argument(
        "--tree", type=Path, default=ROOT, help="the checkout whose server runs (default: this)"
    )
    parser.add_argument(
        "--log", type=Path, default=Path(tempfile.gettempdir()) / "embedx-abuse-server.log"
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    tree = args.tree.resolve()
    result: dict[str, Any] = {"benchmark": "abuse", "server_commit": commit(tree)}
    if 1 in args.points:
        result["long_text"] = [long_text(tree, args.log, mb) for mb in args.text_mb]
    if 3 in args.points:
        result["slow_bodies"] = slow_bodies(tree, args.log, args.slow_clients)
    if 4 in args.points:
        result["large_bodies"] = large_bodies(tree, args.log, args.bodies, args.body_mb)
    result["environment"] = environment()
    write_json(result, args.out)


if __name__ == "__main__":
    main()
