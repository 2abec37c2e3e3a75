"""The RSGI bridge `embedx serve` puts in front of the ASGI app: a body in one message, the
response in one call, a client leaving mid-body. The real server over it is
tests/test_server_http.py's."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from granian.rsgi import ProtocolClosed  # type: ignore[attr-defined]

from embedx.server.asgi import Message, Receive, Scope, Send
from embedx.server.rsgi import RsgiBridge

pytestmark = pytest.mark.anyio


class FakeScope:
    def __init__(self, headers: dict[str, str], path: str = "/v1/embeddings") -> None:
        self.http_version = "1.1"
        self.method = "POST"
        self.scheme = "http"
        self.path = path
        self.query_string = "a=b%20c&q=日本"  # granian decodes it as UTF-8
        self.client = "127.0.0.1:40000"
        self.server = "127.0.0.1:8000"
        self.headers = headers  # granian's RSGIHeaders, as far as the bridge uses them


class FakeProtocol:
    """An RSGI protocol that records what the bridge asks of it."""

    def __init__(self, body: bytes, chunks: list[bytes] | None = None, *, closed: bool = False):
        self.body = body
        self.chunks = chunks or []
        self.closed = closed
        self.reads = 0
        self.responses: list[tuple[int, list[tuple[str, str]], bytes]] = []

    async def __call__(self) -> bytes:
        self.reads += 1
        if self.closed:
            raise ProtocolClosed("RSGI transport is closed")
        return self.body

    def __aiter__(self) -> AsyncIterator[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            for chunk in self.chunks:
                yield chunk
            if self.closed:
                raise ProtocolClosed("RSGI transport is closed")

        return chunks()

    async def client_disconnect(self) -> None:
        return None

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.responses.append((status, headers, body))


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers with how many messages the body took, its length, and the scope it saw."""
    messages: list[Message] = []
    while not messages or messages[-1].get("more_body"):
        messages.append(await receive())
    if messages[-1]["type"] == "http.disconnect":
        return
    size = sum(len(m["body"]) for m in messages)
    seen = f"{len(messages)} {size} {scope['path']} {scope['query_string'].decode()}"
    await send({"type": "http.response.start", "status": 201, "headers": [(b"x-seen", b"1")]})
    await send({"type": "http.response.body", "body": seen.encode(), "more_body": True})
    await send({"type": "http.response.body", "body": b" ok"})


async def test_a_body_of_declared_length_reaches_the_app_in_one_message() -> None:
    protocol = FakeProtocol(b"x" * 60_000)
    await RsgiBridge(echo).__rsgi__(FakeScope({"content-length": "60000"}), protocol)
    assert protocol.reads == 1
    seen = "1 60000 /v1/embeddings a=b%20c&q=日本 ok"
    assert protocol.responses == [(201, [("x-seen", "1")], seen.encode())]


async def test_a_streamed_response_goes_out_as_its_one_part_not_a_copy() -> None:
    big = b"y" * 1_000_000

    async def streams(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # as BlackSheep sends a streamed body: the part, then an empty end
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": big, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    protocol = FakeProtocol(b"{}")
    await RsgiBridge(streams).__rsgi__(FakeScope({"content-length": "2"}), protocol)
    assert protocol.responses[0][2] is big


async def test_a_chunked_body_reaches_the_app_a_chunk_at_a_time() -> None:
    protocol = FakeProtocol(b"", chunks=[b"a" * 10, b"b" * 20])
    await RsgiBridge(echo).__rsgi__(FakeScope({"transfer-encoding": "chunked"}), protocol)
    assert protocol.reads == 0  # counted as it comes, so the app can refuse it midway
    assert protocol.responses[0][2].startswith(b"3 30 ")  # two chunks, then the end


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_client_leaving_mid_body_is_a_disconnect_and_gets_no_response(
    chunked: bool,
) -> None:
    protocol = FakeProtocol(b"", chunks=[b"a"], closed=True)
    headers = {"transfer-encoding": "chunked"} if chunked else {"content-length": "9"}
    await RsgiBridge(echo).__rsgi__(FakeScope(headers), protocol)
    assert protocol.responses == []
