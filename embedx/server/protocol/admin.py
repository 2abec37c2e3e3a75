"""The operational routes on the wire: the shapes of /health and /info, and the description
of those routes, /metrics and the API's own description."""

from __future__ import annotations

from typing import Any

from embedx.server.protocol.schema import ERROR, Described, operation
from embedx.server.swagger import ASSETS

HEALTH = {
    "type": "object",
    "required": ["status"],
    "properties": {
        "status": {"enum": ["ok", "degraded", "failing", "draining"]},
        "quarantined": {"type": "array", "items": {"type": "string"},
                        "description": "model: device (reason), for each device taken out"},
        "failing": {"type": "array", "items": {"type": "string"},
                    "description": "preloaded models that cannot load (status failing, a 503)"},
    },
}  # fmt: skip
_INFO_FIELDS = (("version", "string"), ("uptime_s", "number"), ("settings", "object"),
                ("devices", "array"), ("allocator", "string"), ("requests", "object"),
                ("models", "array"), ("quarantined", "array"))  # fmt: skip
INFO = {
    "type": "object",
    "required": [key for key, _ in _INFO_FIELDS],
    "properties": {key: {"type": kind} for key, kind in _INFO_FIELDS},
}


def operations(server: Described) -> dict[str, dict[str, Any]]:
    """The operational paths as the OpenAPI document describes them."""
    keyed = server.keyed
    return {
        "/": {"get": operation("As /health, as in TEI (with the key, if one is set)", HEALTH,
                               keyed=keyed, unavailable={"anyOf": [HEALTH, ERROR]})},
        "/health": {"get": operation(
            "ok, degraded (a device quarantined), failing (a preloaded model cannot load) "
            "or draining; never needs a key", HEALTH, keyed=False, unavailable=HEALTH)},
        "/info": {"get": operation(
            "Settings, devices, concurrency and resident models", INFO, keyed=keyed)},
        "/metrics": {"get": operation("Prometheus metrics", {"type": "string"},
                                      media="text/plain", keyed=keyed)},
        "/openapi.json": {"get": operation("This description", {"type": "object"}, keyed=keyed)},
        "/docs": {"get": operation("This description as a page: Swagger UI", {"type": "string"},
                                   media="text/html", keyed=keyed)},
        "/docs/{asset}": {"get": _asset(keyed)},
    }  # fmt: skip


def _asset(keyed: bool) -> dict[str, Any]:
    """One of Swagger UI's files, as /docs loads them."""
    described = operation("Swagger UI's files, as /docs loads them", {"type": "string"},
                          errors=(404,), keyed=keyed)  # fmt: skip
    described["responses"]["200"]["content"] = {
        media.split(b";")[0].decode(): {"schema": {"type": "string"}}
        for media in dict.fromkeys(ASSETS.values())
    }
    described["parameters"] = [{"name": "asset", "in": "path", "required": True,
                                "schema": {"enum": list(ASSETS)}}]  # fmt: skip
    return described
