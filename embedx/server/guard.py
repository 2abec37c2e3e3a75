"""The outermost layer, the one place a request's error becomes its answer: it gives each
request its id, refuses what must not reach the app, reads the body, runs the app while
watching the connection, answers an error with its envelope and anything unexpected with a
plain 500 (the traceback goes to the log), then counts the request and logs its line."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager

from embedx.errors import Bug, EmbedxError, ShuttingDown
from embedx.server import cors
from embedx.server.asgi import ASGIApp, Receive, Scope, Send, header
from embedx.server.body import Body
from embedx.server.disconnect import ClientGone, watched
from embedx.server.dispatch import route_of
from embedx.server.http_metrics import CLIENT_CLOSED
from embedx.server.lifespan import lifespan, speak
from embedx.server.refusals import Refusals
from embedx.server.reply import Reply
from embedx.server.state import ServerState
from embedx.untrusted import shown

log = logging.getLogger("embedx.server")
access = logging.getLogger("embedx.access")  # a line per request, at info
MAX_REQUEST_ID = 128
MAX_LOGGED_PATH = 1024
REQUEST_ID_BYTES = re.compile(rb"^[!-~]+$")  # printable ASCII, no spaces: safe in a log line


class Guard:
    def __init__(self, app: ASGIApp, state: ServerState, routes: Iterable[str]) -> None:
        self.app = app
        self.state = state
        self.routes = frozenset(routes)  # the label metrics give each request
        self._refusals = Refusals(state.settings.api_key)
        self._cors = cors.Cors(state.settings.cors_allow_origins)

    def lifespan(self) -> AbstractAsyncContextManager[None]:
        """Preload on entry, drain on exit (`lifespan.lifespan`)."""
        return lifespan(self.state)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await speak(self.lifespan, receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        else:  # a websocket: no route takes one
            await send({"type": "websocket.close", "code": 1000})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        path: str = scope["path"]
        method: str = scope["method"]
        if method == "HEAD":  # a GET without its body (RFC 9110): what uptime probes send
            scope = {**scope, "method": "GET"}
        # 64 random bits, as uuid4's first 16 hex digits were, without making a UUID
        request_id = _given_request_id(scope) or os.urandom(8).hex()
        started = time.perf_counter()
        origin = self._cors.allowed_origin(scope)
        tags = [(b"x-request-id", request_id.encode()), *cors.headers(origin)]
        reply = Reply(send, tags, head=method == "HEAD")
        request = asyncio.current_task()
        assert request is not None, "an ASGI server calls its app in a task"
        state.receiving_body(request)
        body = Body(state.bodies, state.settings)
        try:
            if origin is not None and cors.is_preflight(scope):  # browsers send it without a key
                await reply.empty(204, cors.preflight_headers(scope))
                return
            self._refusals.check(scope, draining=state.draining)
            data = await body.read(scope, receive)
            state.working(request)
            await watched(self.app, scope, data, receive, reply.send)
        except ClientGone:
            reply.status = CLIENT_CLOSED
        except asyncio.CancelledError:
            if not state.draining:
                raise
            # ended by a stop: at once if its body had not arrived (`ServerState.stop_taking`),
            # else once the drain waited long enough (`run._until_stopped`)
            await reply.error(ShuttingDown("the server shut down before this request finished"))
        except EmbedxError as error:
            await reply.error(error)
        except Exception:
            log.exception("request %s %s failed (id %s)", method, shown(path), request_id)
            await reply.error(Bug(f"The request failed unexpectedly (request id {request_id})."))
        finally:
            body.release()
            state.done(request)
            self._log(method, path, reply, request_id, time.perf_counter() - started)

    def _log(self, method: str, path: str, reply: Reply, request_id: str, seconds: float) -> None:
        """Count the request under its route (any other path is "other"), and write its line."""
        route = path if path in self.routes else route_of(path, self.routes) or "other"
        self.state.http.observe(route, method, reply.status, seconds, reply.code)
        access.info(
            "%s %s %d %.1f ms id=%s%s",
            method,
            shown(path, MAX_LOGGED_PATH),  # a %0A forges no line, a long one fills no disk
            reply.status,
            seconds * 1000,
            request_id,
            f" code={reply.code}" if reply.code else "",
        )


def _given_request_id(scope: Scope) -> str | None:
    """The client's (or its proxy's) X-Request-Id, kept so that both logs name the request
    alike: up to 128 printable ASCII characters with no spaces, or none."""
    given = header(scope, b"x-request-id")
    if given is None or not 0 < len(given) <= MAX_REQUEST_ID or not REQUEST_ID_BYTES.match(given):
        return None
    return given.decode("ascii")
