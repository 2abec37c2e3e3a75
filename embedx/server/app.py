"""The app factory: Settings in, the ASGI app out, routes and error handling built once."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from blacksheep import Application, Request, Response
from blacksheep.server.routing import Router

from embedx.config import Settings
from embedx.errors import Bug, EmbedxError, MethodNotAllowed, NotFound
from embedx.registry import ModelRegistry, check_default_model, check_preload
from embedx.server import admin, embeddings
from embedx.server.admission import Admission
from embedx.server.edge import ERROR_CODE, REQUEST_ID, Edge, route_of
from embedx.server.responses import error_response
from embedx.server.state import ServerState
from embedx.untrusted import shown

log = logging.getLogger("embedx.server")
Handler = Callable[[ServerState, Request], Awaitable[Response]]

ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("POST", "/v1/embeddings", embeddings.create_embeddings),
    ("GET", "/v1/models", embeddings.list_models),
    ("GET", "/v1/models/{path:model}", embeddings.retrieve_model),
    # infinity's paths, as its clients' OpenAI base URL has no /v1
    ("POST", "/embeddings", embeddings.create_embeddings),
    ("GET", "/models", embeddings.list_models),
    ("GET", "/models/{path:model}", embeddings.retrieve_model),
    ("POST", "/embed", embeddings.embed_tei),
    ("POST", "/", embeddings.embed_tei),  # TEI's route too: clients given the bare URL post here
    ("GET", "/health", admin.health),
    ("GET", "/", admin.health),  # TEI's health check there too (with the key, if one is set)
    ("GET", "/info", admin.info),
    ("GET", "/metrics", admin.metrics),
    ("GET", "/openapi.json", admin.openapi_json),
    ("GET", "/docs", admin.docs),
)


def create_app(settings: Settings, registry: ModelRegistry | None = None) -> Edge:
    """The whole server as one ASGI app. Without a registry, devices are discovered and the
    catalog read here, before anything is served."""
    if registry is None:
        from embedx.devices import discover, open_accelerator
        from embedx.models.catalog import load_catalog

        registry = ModelRegistry(
            settings,
            load_catalog(settings.models_file),
            discover(settings),
            open_accelerator,
            local_paths=settings.allow_local_paths,
        )
    check_preload(settings, registry.catalog)
    check_default_model(settings, registry.catalog)
    admission = Admission(settings.max_concurrent_requests, settings.request_queue_timeout_s)
    state = ServerState(settings, registry, registry.devices, admission)
    app = Application(router=Router())
    # embedx's access log has a line a request; BlackSheep's (set to INFO as the app is
    # made) would add one for each 4xx
    app.logger.setLevel(logging.WARNING)
    for method, path, handler in ROUTES:
        app.router.add(method, path, _bound(state, handler))
    app.router.fallback = _fallback
    app.exceptions_handlers[EmbedxError] = _embedx_error
    app.exceptions_handlers[Exception] = _unexpected_error

    async def drain(application: Application) -> None:
        await registry.drain(settings.drain_timeout_s)

    app.on_stop += drain  # the edge preloads, once the app has started
    return Edge(app, state, frozenset(path for _, path, _ in ROUTES))


def _bound(state: ServerState, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def route(request: Request) -> Response:
        return await handler(state, request)

    route.__name__ = handler.__name__
    return route


async def _fallback(request: Request) -> Response:
    path = request.url.path.decode()
    allowed = [method for method, known, _ in ROUTES if route_of(path, (known,))]
    if "GET" in allowed:
        allowed.append("HEAD")  # the edge answers HEAD as GET without the body
    method = shown(request.method)
    if allowed:
        return _answer(
            request, MethodNotAllowed(f"{method} is not allowed on {shown(path)}", allow=allowed)
        )
    return _answer(request, NotFound(f"no route {method} {shown(path)}; see /docs"))


async def _embedx_error(app: Any, request: Request, error: EmbedxError) -> Response:
    return _answer(request, error)


def _answer(request: Request, error: EmbedxError) -> Response:
    """The error's envelope, its code left for the edge's metrics and access line."""
    scope = cast("dict[str, object]", request.scope)  # typed with ASGI's keys alone
    scope[ERROR_CODE] = error.code
    return error_response(error)


async def _unexpected_error(app: Any, request: Request, error: Exception) -> Response:
    """A route's own bug: logged with the request's id, which its 500 names too."""
    request_id = request.scope.get(REQUEST_ID, "unknown")
    path = request.url.path.decode()
    log.error("request %s %s failed (id %s)", request.method, path, request_id, exc_info=error)
    return _answer(request, Bug(f"The request failed unexpectedly (request id {request_id})."))
