"""Clients that send slowly, or send much at once: a body too slow to arrive gets a 408 and its
connection closed, a thousand of them lock no other client out nor hold a stop, and large
bodies arriving together wait for the byte budget rather than all being held in memory. The
real server, as it is about sockets (the budget alone: test_server_admission.py)."""

from __future__ import annotations

import contextlib
import resource
import select
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.models import MINILM_NAME
from tests.support.server import Server, client, running_server, until_receiving
from tests.support.waiting import PATIENCE_S

pytestmark = pytest.mark.process  # each test starts a process of its own

# Above 1,024: granian's default cap on the connections it holds, which such clients filled.
SLOW_CLIENTS = 1100
HEAD = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
STALLED = HEAD + b'Content-Length: 100\r\n\r\n{"input":'  # 9 bytes of 100, then nothing


def address(server: Server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (60 s at most)."""
    sock.settimeout(60)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def status_headers_error(answer: bytes) -> tuple[int, dict[str, str], dict[str, str]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, orjson.loads(body)["error"]


@contextlib.contextmanager
def stalled_sockets(server: Server, count: int) -> Iterator[list[socket.socket]]:
    """`count` connections, each with its headers and the start of its body sent, no more."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 256
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"{count} sockets need {wanted} open files; this process may open {hard}")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(socket.create_connection(address(server), timeout=60))
            sockets[-1].sendall(STALLED)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def test_a_slow_body_gets_a_408_and_its_connection_is_closed(tmp_path: Path) -> None:
    with running_server(tmp_path, body_timeout_s=0.5) as server:
        with socket.create_connection(address(server)) as declared:
            declared.sendall(HEAD + b'Content-Length: 3000000\r\n\r\n{"input":')
            status, headers, error = status_headers_error(answer(declared))  # to its close
        assert status == 408
        assert headers["connection"] == "close"
        assert error["code"] == "body_timeout"
        assert "within 1.5 s" in error["message"]  # 0.5 s for each of its 3 MB
        with socket.create_connection(address(server)) as chunked:
            chunked.sendall(HEAD + b'Transfer-Encoding: chunked\r\n\r\n9\r\n{"input":\r\n')
            status, headers, error = status_headers_error(answer(chunked))
        assert status == 408
        assert "within 0.5 s" in error["message"]  # 9 bytes came: the least any body gets
        assert httpx.get(server.url + "/health").status_code == 200


def test_a_thousand_slow_bodies_lock_no_one_out_nor_hold_the_stop(tmp_path: Path) -> None:
    # bodies allowed ten minutes, and a drain as long: neither runs out during the test
    with (
        running_server(
            tmp_path, preload=MINILM_NAME, body_timeout_s=600, drain_timeout_s=600
        ) as server,
        stalled_sockets(server, SLOW_CLIENTS) as stalled,
    ):
        until_receiving(server, SLOW_CLIENTS)
        served = (
            client(server)
            .with_options(timeout=60)
            .embeddings.create(model=MINILM_NAME, input="served beside them")
        )
        assert len(served.data[0].embedding) == 384
        waiting = select.poll()
        for sock in stalled:
            waiting.register(sock, select.POLLIN)
        assert waiting.poll(0) == [], "a slow body was answered: it no longer waited"

        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(PATIENCE_S) == 0  # not the 600 s drain: no work was in flight
        answers = [status_headers_error(answer(sock)) for sock in stalled]
    assert {(status, error["code"]) for status, _, error in answers} == {(503, "shutting_down")}


def vm_kib(pid: int, field: str) -> int:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith(field + ":"):
            return int(row.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


BODY_BYTES = 8_000_000
BUDGET = 2 * BODY_BYTES
BODIES = 48


def test_large_bodies_at_once_wait_for_the_byte_budget_and_all_get_vectors(
    tmp_path: Path,
) -> None:
    request = orjson.dumps({"model": MINILM_NAME, "input": ["a large body, mostly spaces"]})
    # JSON's whitespace: bytes to read and parse, and nothing for the model to do
    body = request[:-1] + b" " * (BODY_BYTES - len(request)) + b"}"
    with running_server(
        tmp_path,
        preload=MINILM_NAME,
        max_request_bytes=BODY_BYTES,
        max_body_bytes_in_flight=BUDGET,
        request_queue_timeout_s=600,  # every one waits its turn: none is refused
    ) as server:
        url = server.url + "/v1/embeddings"
        headers = {"content-type": "application/json"}
        assert httpx.post(url, content=body, headers=headers, timeout=60).status_code == 200
        pid = server.process.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak from here on
        before_kib = vm_kib(pid, "VmRSS")
        start = threading.Barrier(BODIES)
        answered: list[httpx.Response] = []

        def send() -> None:
            start.wait()
            answered.append(httpx.post(url, content=body, headers=headers, timeout=600))

        senders = [threading.Thread(target=send) for _ in range(BODIES)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        grown = (vm_kib(pid, "VmHWM") - before_kib) * 1024
    assert [r.status_code for r in answered] == [200] * BODIES
    assert all(len(r.json()["data"][0]["embedding"]) == 384 for r in answered)
    # A body's bytes are held about 2.5 times over while it is read and parsed (granian's
    # buffer, Python's copy, the app's): the budget's worth grew the server by 43 MB, and all
    # 48 bodies at once, as they were read before the budget, by 863 MB.
    assert grown < 8 * BUDGET, f"the server grew {grown / 1e6:.0f} MB"
