"""The app inside the guard: each request to its route's handler, over BlackSheep's router,
requests and responses, a path no route takes a 404 and a method its route lacks a 405, every
error raised on for the guard to answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, cast

from blacksheep import Request, Response
from blacksheep.contents import ASGIContent
from blacksheep.scribe import send_asgi_response
from blacksheep.server.routing import Router

from embedx.errors import MethodNotAllowed, NotFound
from embedx.server.asgi import Receive, Scope, Send
from embedx.server.state import ServerState
from embedx.untrusted import shown

Handler = Callable[[ServerState, Request], Awaitable[Response]]
Route = tuple[str, str, Handler]  # method, path (BlackSheep's pattern), handler


class Dispatch:
    def __init__(self, routes: Sequence[Route], state: ServerState) -> None:
        self._routes = routes
        self._router = Router()
        for method, path, handler in routes:
            self._router.add(method, path, _bound(state, handler))
        self._router.fallback = self._unrouted
        self._router.apply_routes()
        self._router.sort_routes()  # type: ignore[no-untyped-call]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # BlackSheep's own reading of an ASGI request (`Application.instantiate_request`)
        raw_path = scope.get("raw_path") or scope["path"].encode()
        headers = list(scope["headers"])
        request = Request.incoming(scope["method"], raw_path, scope["query_string"], headers)
        request.scope = cast("Any", scope)
        request.content = ASGIContent(cast("Any", receive))
        match = self._router.get_match(request)
        assert match is not None, "the router has a fallback"
        request.route_values = match.values
        response = await match.handler(request)
        await send_asgi_response(response, send)
        request.dispose()

    async def _unrouted(self, request: Request) -> Response:
        path = request.url.path.decode()
        allowed = [method for method, known, _ in self._routes if route_of(path, (known,))]
        if "GET" in allowed:
            allowed.append("HEAD")  # the guard answers HEAD as GET without the body
        method = shown(request.method)
        if allowed:
            raise MethodNotAllowed(f"{method} is not allowed on {shown(path)}", allow=allowed)
        raise NotFound(f"no route {method} {shown(path)}; see /docs")


def _bound(state: ServerState, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def route(request: Request) -> Response:
        return await handler(state, request)

    route.__name__ = handler.__name__
    return route


def route_of(path: str, routes: Iterable[str]) -> str | None:
    """The route `path` falls under: itself, or one ending in a `{path:...}` parameter whose
    prefix it extends (`/v1/models/{path:model}`: model names hold slashes)."""
    for route in routes:
        head, parameter, _ = route.partition("{path:")
        if route == path or (parameter and path.startswith(head) and len(path) > len(head)):
            return route
    return None
