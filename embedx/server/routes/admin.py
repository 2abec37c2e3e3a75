"""The operational routes: /health, /info, /metrics, and the API's own description (with
Swagger UI's files for /docs)."""

from __future__ import annotations

import time
from typing import Any

from blacksheep import Content, Request, Response

from embedx import __version__
from embedx.allocator import process_allocator
from embedx.server import swagger
from embedx.server.metrics import CONTENT_TYPE, exposition
from embedx.server.openapi import docs_page, openapi_spec
from embedx.server.protocol.tei import tei_default
from embedx.server.responses import json_response
from embedx.server.state import ServerState


async def health(state: ServerState, http: Request) -> Response:
    """For load balancers and orchestrators: touches no model and takes no request slot.
    503 while draining, or while a preloaded model cannot load (it is tried again every
    30 s): the server cannot do what it was started for, and a restart may mend a device."""
    if state.draining:
        return json_response({"status": "draining"}, 503, {"Retry-After": "10"})
    degraded = state.registry.degraded()
    failing = state.registry.failing()
    status = "failing" if failing else "degraded" if degraded else "ok"
    body = {"status": status, "quarantined": degraded, "failing": failing}
    return json_response(body, 503 if failing else 200)


async def info(state: ServerState, http: Request) -> Response:
    settings = state.settings.redacted()
    if settings["models_file"] is not None and not state.settings.show_model_sources:
        settings["models_file"] = "set"  # where it lies is the operator's business
    return json_response(
        {
            "version": __version__,
            "uptime_s": round(time.time() - state.started_at, 1),
            "settings": settings,
            "devices": [d.as_dict() for d in state.devices],
            "allocator": process_allocator(),
            "requests": {
                **state.admission.describe(),
                "http_in_flight": state.in_flight,
                "http_receiving": len(state.receiving),  # bodies still arriving
            },
            "models": state.registry.describe(),
            "quarantined": state.registry.degraded(),
        }
    )


async def metrics(state: ServerState, http: Request) -> Response:
    return Response(200, None, Content(CONTENT_TYPE, exposition(state.metrics)))


async def openapi_json(state: ServerState, http: Request) -> Response:
    return json_response(openapi_spec(**_described(state)))


async def docs(state: ServerState, http: Request) -> Response:
    page = docs_page(**_described(state))
    return Response(200, None, Content(b"text/html; charset=utf-8", page.encode()))


async def docs_asset(state: ServerState, http: Request) -> Response:
    media, body = swagger.asset(http.route_values["asset"] or "")
    return Response(200, [(b"cache-control", b"max-age=86400")], Content(media, body))


def _described(state: ServerState) -> dict[str, Any]:
    """The settings the description depends on: whether a key is needed, how many texts a
    request takes, whether TEI's requests may name no model."""
    settings = state.settings
    return {
        "keyed": settings.api_key is not None,
        "max_items": settings.max_request_items,
        "default_model": tei_default(settings) is not None,
    }
