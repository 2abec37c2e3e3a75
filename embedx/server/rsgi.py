"""granian's RSGI in front of the ASGI app, for `embedx serve`.

Through granian's ASGI a request body arrives in 16 KiB messages, each an await that only the
event loop can finish; a busy loop makes every one of them wait its turn (a 256-text request,
about 60 KB, waited 40 ms on average for its body on an H200 under
bench/load.py). RSGI hands over a body with a declared length in one await and
takes the response in one call. The app stays ASGI, so tests and other servers run it as is;
granian's RSGI has no lifespan: `embedx serve` enters the app's itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol
from urllib.parse import quote

from granian.rsgi import ProtocolClosed  # type: ignore[attr-defined]  # re-exported there

from embedx.server.asgi import ASGIApp, Message, Scope


class RsgiScope(Protocol):
    http_version: str
    method: str
    scheme: str
    path: str  # percent-decoded; RSGI has no raw path
    query_string: str
    client: str
    server: str

    @property
    def headers(self) -> Any: ...  # granian's RSGIHeaders: `in`, items()


class RsgiProtocol(Protocol):
    async def __call__(self) -> bytes: ...
    def __aiter__(self) -> AsyncIterator[bytes]: ...
    async def client_disconnect(self) -> None: ...
    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None: ...


class RsgiBridge:
    """Serves an ASGI app's HTTP requests to granian over RSGI."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __rsgi__(self, scope: RsgiScope, protocol: RsgiProtocol) -> None:
        exchange = _Exchange(protocol, chunked="transfer-encoding" in scope.headers)
        await self.app(_asgi_scope(scope), exchange.receive, exchange.send)
        exchange.respond()


class _Exchange:
    """One request's ASGI channels over its RSGI protocol: the response is kept until the
    app is done, then sent in one piece (embedx never streams one)."""

    def __init__(self, protocol: RsgiProtocol, *, chunked: bool) -> None:
        self._protocol = protocol
        # A body of declared length (or none) is read whole: the app checked the length first.
        self._chunked = chunked
        self._chunks: AsyncIterator[bytes] | None = None
        self._body_done = False
        self._status: int | None = None
        self._headers: list[tuple[str, str]] = []
        self._body: list[bytes] = []

    async def receive(self) -> Message:
        # Cancelling a read (a body past its deadline, a stop) is safe: granian's future drops
        # its Rust side, which stops reading the body, and hyper then closes the connection
        # after the response, the body being unread. The guard asks for no more of it.
        try:
            if self._body_done:  # the app watches for the client leaving
                await self._protocol.client_disconnect()
                return {"type": "http.disconnect"}
            if not self._chunked:
                self._body_done = True
                return {"type": "http.request", "body": await self._protocol(), "more_body": False}
            # chunked: a chunk at a time, so that the app counts the body against its limit
            if self._chunks is None:
                self._chunks = self._protocol.__aiter__()
            # not the builtin anext(): its wrapper over granian's iterator crashes the process
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            chunk = None
        except ProtocolClosed:  # the client left mid-body
            return {"type": "http.disconnect"}
        self._body_done = chunk is None
        return {"type": "http.request", "body": chunk or b"", "more_body": chunk is not None}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._status = message["status"]
            self._headers = [
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in message.get("headers", [])
            ]
        elif body := message.get("body", b""):
            # not the empty last part BlackSheep sends after a streamed body: the join of
            # one part is that part, not a copy of a response that can run to megabytes
            self._body.append(body)

    def respond(self) -> None:
        """Send the response, if the app made one (not for a client that left: granian
        answers a request left without one with an empty 500)."""
        if self._status is not None:
            self._protocol.response_bytes(self._status, self._headers, b"".join(self._body))


PATH_SAFE = "/!$&'()*+,;=:@~"  # RFC 3986's path characters, left as they are


def _asgi_scope(scope: RsgiScope) -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": scope.http_version,
        "method": scope.method,
        "scheme": scope.scheme,
        "path": scope.path,
        # RSGI gives the path decoded; BlackSheep parses the raw one, which must be ASCII
        # and carry no space: quoted again, `/v1/models/a%20b` is the name `a b`, not a 500
        "raw_path": quote(scope.path, safe=PATH_SAFE).encode(),
        "query_string": scope.query_string.encode(),  # granian decodes it as UTF-8
        "root_path": "",
        "headers": [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in scope.headers.items()
        ],
        "client": _host_port(scope.client),
        "server": _host_port(scope.server),
    }


def _host_port(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition(":")
    return (host.strip("[]"), int(port)) if port.isdigit() else None
