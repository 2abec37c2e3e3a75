"""The outermost ASGI layer: refuses what must not reach the app (draining, no key, a body over
the limit), notices a client that hangs up (and cancels its request), counts every request,
and turns anything unexpected into a plain 500 envelope while the traceback goes to the log."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from embedx.errors import AuthenticationFailed, Bug, EmbedxError, PayloadTooLarge, ShuttingDown
from embedx.server.responses import error_body
from embedx.server.state import ServerState

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("embedx.server")
CLIENT_CLOSED = 499  # the status metrics record for a request whose client hung up
OPEN_PATHS = frozenset({"/health"})  # no key needed


class ClientGone(Exception):
    """The client disconnected before its request finished."""


class Edge:
    def __init__(self, app: ASGIApp, state: ServerState, paths: frozenset[str]) -> None:
        self.app = app
        self.state = state
        self.paths = paths  # routes known to the app: the label metrics use
        key = state.settings.api_key
        self._expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: the app starts and stops the registry
            await self.app(scope, receive, send)
            return
        state = self.state
        path: str = scope["path"]
        request_id = uuid.uuid4().hex[:16].encode()
        started = time.perf_counter()
        response = _Response(send, request_id)
        state.in_flight += 1
        state.idle.clear()
        try:
            refusal = self._refusal(scope, path)
            if refusal is not None:
                await response.error(refusal)
                return
            body = await self._body(scope, receive)
            await self._dispatch(scope, body, receive, response)
        except ClientGone:
            response.status = CLIENT_CLOSED
        except EmbedxError as error:
            await response.error(error)
        except Exception:
            log.exception(
                "request %s %s failed (id %s)", scope["method"], path, request_id.decode()
            )
            await response.error(
                Bug(f"The request failed unexpectedly (request id {request_id.decode()}).")
            )
        finally:
            state.in_flight -= 1
            if not state.in_flight:
                state.idle.set()
            route = path if path in self.paths else route_of(path, self.paths) or "other"
            state.http.observe(
                route, scope["method"], response.status, time.perf_counter() - started
            )

    def _refusal(self, scope: Scope, path: str) -> EmbedxError | None:
        if self.state.draining and path not in OPEN_PATHS:
            return ShuttingDown("the server is shutting down; send the request to another replica")
        if self._expected is None or path in OPEN_PATHS:
            return None
        given = _header(scope, b"authorization")
        if given is None:
            return AuthenticationFailed("missing API key: send `Authorization: Bearer <key>`")
        if not hmac.compare_digest(given, self._expected):
            return AuthenticationFailed("wrong API key")
        return None

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.state.settings.max_request_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(int(declared), limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:  # a chunked body says nothing in advance: count as it comes
                raise _too_large(size, limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _dispatch(
        self, scope: Scope, body: bytes, receive: Receive, response: _Response
    ) -> None:
        """Run the app on the buffered body while watching the connection: a client that
        hangs up has its request cancelled, which drops its pending texts from the queue."""
        hung_up = asyncio.get_running_loop().create_future()
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await asyncio.shield(hung_up)

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    hung_up.set_result(message)
                    return

        app = asyncio.ensure_future(self.app(scope, replay, response.send))
        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({app, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not app.done():
                app.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await app
                raise ClientGone
            app.result()
        finally:
            watcher.cancel()
            app.cancel()


class _Response:
    """The send channel of one request: tags the response, remembers its status."""

    def __init__(self, send: Send, request_id: bytes) -> None:
        self._send = send
        self._request_id = request_id
        self.status = 500
        self.started = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.status = message["status"]
            message["headers"] = [*message.get("headers", []), (b"x-request-id", self._request_id)]
        await self._send(message)

    async def error(self, error: EmbedxError) -> None:
        if self.started:  # too late for a clean error: the log has it
            return
        status, headers, body = error_body(error)
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})


def route_of(path: str, routes: Iterable[str]) -> str | None:
    """The route `path` falls under: itself, or one ending in a `{path:...}` parameter whose
    prefix it extends (`/v1/models/{path:model}`: model names hold slashes)."""
    for route in routes:
        head, parameter, _ = route.partition("{path:")
        if route == path or (parameter and path.startswith(head) and len(path) > len(head)):
            return route
    return None


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body has {size} bytes or more; "
        f"the limit is {limit} (EMBEDX_MAX_REQUEST_BYTES)"
    )
