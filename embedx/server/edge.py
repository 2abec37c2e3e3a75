"""The outermost ASGI layer: refuses what must not reach the app (draining, no key, a body over
the limit, or too slow to arrive), reads a body once its bytes fit the server's budget,
answers browsers' CORS preflights for the origins allowed, notices a client that hangs up (and
cancels its request), counts every request, and turns anything unexpected into a plain 500
envelope while the traceback goes to the log; after a body of megabytes it has the allocator
give the memory back. At startup it loads the models to preload, once the app has started."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from embedx.allocator import GIVE_BACK_AFTER_BYTES, give_back_soon
from embedx.errors import (
    AuthenticationFailed,
    BodyTimeout,
    Bug,
    EmbedxError,
    InvalidRequest,
    PayloadTooLarge,
    ShuttingDown,
)
from embedx.server.metrics import CLIENT_CLOSED
from embedx.server.responses import error_body
from embedx.server.state import ServerState
from embedx.untrusted import shown

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("embedx.server")
access = logging.getLogger("embedx.access")  # a line per request, at info
OPEN_PATHS = frozenset({"/health"})  # no key needed
REQUEST_ID = "embedx.request_id"  # the scope key that carries a request's id to the app
ERROR_CODE = "embedx.error_code"  # where the app leaves an error's code, for metrics and the log
MAX_REQUEST_ID = 128
MAX_LOGGED_PATH = 1024
REQUEST_ID_BYTES = re.compile(rb"^[!-~]+$")  # printable ASCII, no spaces: safe in a log line
# What a browser page on an allowed origin may send and read (CORS).
CORS_METHODS = b"GET, POST"
CORS_EXPOSED = b"x-request-id, x-tokenization-time, x-inference-time, x-total-time, x-total-tokens"
CORS_MAX_AGE = b"600"  # seconds a browser may reuse a preflight's answer


class ClientGone(Exception):
    """The client disconnected before its request finished."""


class Edge:
    def __init__(self, app: ASGIApp, state: ServerState, paths: frozenset[str]) -> None:
        self.app = app
        self.state = state
        self.paths = paths  # routes known to the app: the label metrics use
        key = state.settings.api_key
        self._key = key.encode() if key else None
        origins = state.settings.cors_allow_origins
        self._any_origin = "*" in origins
        self._origins = frozenset(origin.rstrip("/").encode() for origin in origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._preloading_send(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = self.state
        path: str = scope["path"]
        method: str = scope["method"]
        if method == "HEAD":  # a GET without its body (RFC 9110): what uptime probes send
            scope = {**scope, "method": "GET"}
        request_id = _given_request_id(scope) or uuid.uuid4().hex[:16]
        scope[REQUEST_ID] = request_id  # for the app's own error handler
        started = time.perf_counter()
        origin = self._allowed_origin(scope)
        response = _Response(
            send, request_id.encode(), _cors_headers(origin), head=method == "HEAD"
        )
        request = asyncio.current_task()
        assert request is not None, "an ASGI server calls its app in a task"
        state.receiving.add(request)  # in flight once its body is in (`ServerState`)
        reserved = 0  # bytes of the body budget this request holds
        large = False
        try:
            if origin is not None and _is_preflight(scope):  # browsers send it without a key
                await response.preflight(scope)
                return
            if not path.startswith("/"):  # CONNECT host:port, say: no route could take it
                await response.error(InvalidRequest("the request target must be a path"))
                return
            refusal = self._refusal(scope, path)
            if refusal is not None:
                await response.error(refusal)
                return
            declared = self._declared_length(scope)
            # held until the request is done: its body is read, parsed, tokenized meanwhile
            reserved = await state.bodies.reserve(
                state.settings.max_request_bytes if declared is None else declared
            )
            body = await self._body(receive, declared)
            if len(body) < reserved:  # a chunked body, shorter than the largest one
                state.bodies.release(reserved - len(body))
                reserved = len(body)
            large = len(body) >= GIVE_BACK_AFTER_BYTES
            state.receiving.discard(request)
            state.requests.add(request)
            state.idle.clear()
            await self._dispatch(scope, body, receive, response)
        except ClientGone:
            response.status = CLIENT_CLOSED
        except asyncio.CancelledError:
            if not state.draining:
                raise
            # ended by a stop: at once if its body had not arrived (`ServerState.stop_taking`),
            # else once the drain waited long enough (`run._until_stopped`)
            if not response.started:
                await response.error(
                    ShuttingDown("the server shut down before this request finished")
                )
        except EmbedxError as error:
            await response.error(error)
        except Exception:
            log.exception("request %s %s failed (id %s)", method, path, request_id)
            await response.error(Bug(f"The request failed unexpectedly (request id {request_id})."))
        finally:
            state.bodies.release(reserved)
            state.receiving.discard(request)
            if large:  # on the loop's next turn: once this frame, and the body, are gone
                asyncio.get_running_loop().call_soon(give_back_soon)
            state.requests.discard(request)
            if not state.requests:
                state.idle.set()
            route = path if path in self.paths else route_of(path, self.paths) or "other"
            seconds = time.perf_counter() - started
            code = response.code or scope.get(ERROR_CODE)
            state.http.observe(route, method, response.status, seconds, code)
            access.info(
                "%s %s %d %.1f ms id=%s%s",
                method,
                shown(path, MAX_LOGGED_PATH),  # a %0A forges no line, a long one fills no disk
                response.status,
                seconds * 1000,
                request_id,
                f" code={code}" if code else "",
            )

    def _preloading_send(self, send: Send) -> Send:
        """The lifespan's `send`, loading EMBEDX_PRELOAD's models once the app has started
        and before the server hears so. A model that fails to load fails the startup with its
        error's message (raised in the app's own startup, it came with a traceback)."""
        state = self.state

        async def send_once_preloaded(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                try:
                    await state.registry.preload(state.settings.preload)
                except ShuttingDown:  # stopped while loading (`embedx serve`)
                    pass
                except EmbedxError as error:
                    failed = f"a model of EMBEDX_PRELOAD did not load: {error.message}"
                    message = {"type": "lifespan.startup.failed", "message": failed}
            await send(message)

        return send_once_preloaded

    def _allowed_origin(self, scope: Scope) -> bytes | None:
        """The value of `access-control-allow-origin` this request gets, if any."""
        if not (self._any_origin or self._origins):
            return None
        origin = _header(scope, b"origin")
        if origin is None:
            return None
        return b"*" if self._any_origin else origin if origin in self._origins else None

    def _refusal(self, scope: Scope, path: str) -> EmbedxError | None:
        if self.state.draining and path not in OPEN_PATHS:
            return ShuttingDown("the server is shutting down; send the request to another replica")
        if self._key is None or path in OPEN_PATHS:
            return None
        given = _header(scope, b"authorization")
        if given is None:
            return AuthenticationFailed("missing API key: send `Authorization: Bearer <key>`")
        scheme, _, key = given.strip().partition(b" ")
        if scheme.lower() != b"bearer":  # schemes are case-insensitive (RFC 9110)
            return AuthenticationFailed("send the API key as `Authorization: Bearer <key>`")
        if not hmac.compare_digest(key.strip(), self._key):
            return AuthenticationFailed("wrong API key")
        return None

    def _declared_length(self, scope: Scope) -> int | None:
        """The body's length, as its headers give it; None for a chunked one, which says
        nothing in advance. One over EMBEDX_MAX_REQUEST_BYTES is refused unread."""
        if _header(scope, b"transfer-encoding") is not None:  # it overrides a content-length
            return None
        declared = _header(scope, b"content-length")
        size = int(declared) if declared is not None and declared.isdigit() else 0
        limit = self.state.settings.max_request_bytes
        if size > limit:
            raise _too_large(size, limit)
        return size

    async def _body(self, receive: Receive, declared: int | None) -> bytes:
        """The whole body, read by a deadline of EMBEDX_BODY_TIMEOUT_S for each MB of it (at
        least that much for any body): set at once for a body of declared length, and moved
        on as a chunked body's bytes arrive. A client that sends slower gets a 408, and its
        connection is closed: otherwise slow clients would hold connections as long as they
        liked. The deadline cancels the await on the server's read (granian's RSGI drops
        its read of the body then)."""
        limit = self.state.settings.max_request_bytes
        per_mb = self.state.settings.body_timeout_s
        started = asyncio.get_running_loop().time()
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout_at(started + _allowed_s(declared or 0, per_mb)) as timer:
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
                    if declared is None:
                        timer.reschedule(started + _allowed_s(size, per_mb))
        except TimeoutError:
            allowed = _allowed_s(declared if declared is not None else size, per_mb)
            raise BodyTimeout(
                f"the request body did not arrive within {allowed:g} s "
                f"(EMBEDX_BODY_TIMEOUT_S: {per_mb:g} s for each MB, and at least that)"
            ) from None

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
    """The send channel of one request: tags the response (request id, CORS headers),
    remembers its status; for a HEAD request, sends the headers alone (their
    content-length still the body's)."""

    def __init__(
        self, send: Send, request_id: bytes, cors: list[tuple[bytes, bytes]], *, head: bool
    ) -> None:
        self._send = send
        self._tags = [(b"x-request-id", request_id), *cors]
        self._head = head
        self.status = 500
        self.code: str | None = None  # an error's, where the edge answered with one
        self.started = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.status = message["status"]
            message["headers"] = [*message.get("headers", []), *self._tags]
        elif self._head:
            message = {**message, "body": b""}
        await self._send(message)

    async def preflight(self, scope: Scope) -> None:
        """204 to a CORS preflight from an allowed origin: the methods, and the headers it
        asked to send (Authorization among them, which no wildcard covers)."""
        asked = _header(scope, b"access-control-request-headers")
        headers = [
            (b"access-control-allow-methods", CORS_METHODS),
            (b"access-control-max-age", CORS_MAX_AGE),
            *([(b"access-control-allow-headers", asked)] if asked else []),
        ]
        await self.send({"type": "http.response.start", "status": 204, "headers": headers})
        await self.send({"type": "http.response.body", "body": b""})

    async def error(self, error: EmbedxError) -> None:
        if self.started:  # too late for a clean error: the log has it
            return
        self.code = error.code
        status, headers, body = error_body(error)
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})


def _is_preflight(scope: Scope) -> bool:
    return (
        scope["method"] == "OPTIONS"
        and _header(scope, b"access-control-request-method") is not None
    )


def _cors_headers(origin: bytes | None) -> list[tuple[bytes, bytes]]:
    if origin is None:
        return []
    headers = [
        (b"access-control-allow-origin", origin),
        (b"access-control-expose-headers", CORS_EXPOSED),
    ]
    if origin != b"*":  # the answer depends on the request's origin: caches must know
        headers.append((b"vary", b"origin"))
    return headers


def route_of(path: str, routes: Iterable[str]) -> str | None:
    """The route `path` falls under: itself, or one ending in a `{path:...}` parameter whose
    prefix it extends (`/v1/models/{path:model}`: model names hold slashes)."""
    for route in routes:
        head, parameter, _ = route.partition("{path:")
        if route == path or (parameter and path.startswith(head) and len(path) > len(head)):
            return route
    return None


def _given_request_id(scope: Scope) -> str | None:
    """The client's (or its proxy's) X-Request-Id, kept so that both logs name the request
    alike: up to 128 printable ASCII characters with no spaces, or none."""
    given = _header(scope, b"x-request-id")
    if given is None or not 0 < len(given) <= MAX_REQUEST_ID or not REQUEST_ID_BYTES.match(given):
        return None
    return given.decode("ascii")


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _allowed_s(size: int, per_mb: float) -> float:
    return per_mb * max(1.0, size / 1e6)


def _too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body has {size} bytes or more; "
        f"the limit is {limit} (EMBEDX_MAX_REQUEST_BYTES)"
    )
