"""OpenAI's routes: /v1/embeddings and /v1/models (and infinity's paths for them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from blacksheep import Request, Response

from embedx.engine import EmbedResult
from embedx.errors import ModelNotFound
from embedx.registry import Resident
from embedx.server.protocol.openai import INFINITY, OPENAI, Base64Items, parse_openai
from embedx.server.responses import json_bytes_response, json_response
from embedx.server.routes.embedding import embed, json_body, timing
from embedx.server.state import ServerState
from embedx.untrusted import shown


async def create_embeddings(state: ServerState, http: Request) -> Response:
    family = INFINITY if _infinitys(http) else OPENAI
    request = parse_openai(await json_body(http), state.settings.max_request_items, family)
    if request.keyed or request.encodings != ("base64",):
        result = await embed(state, request)
        rows: Any = result.vectors  # floats, or an int8 format's ints: numpy's, for orjson
        beyond = _beyond_rows(result)
        if request.keyed:
            parts = {name: _json_rows(name, part) for name, part in result.encoded.items()
                     if "dense" in request.outputs}  # fmt: skip
            parts.update(beyond)
            rows = [{name: part[i] for name, part in parts.items()}
                    for i in range(len(request.texts))]  # fmt: skip
        elif beyond:
            rows = beyond["sparse"]
        data = [{"object": "embedding", "index": i, "embedding": row}
                for i, row in enumerate(rows)]  # fmt: skip
        payload = {"object": "list", "data": data, "model": request.model, "usage": _usage(result)}
        return json_response(payload, headers=timing(result))
    # The SDK's default, and the bulk of a busy server's responses: the engine writes each
    # row's base64 (made on the device) straight into its item of the response, laid out
    # before the rows exist, not a Python object per row.
    items = Base64Items()
    result = await embed(state, request, items)
    rest = orjson.dumps({"model": request.model, "usage": _usage(result)})
    return json_bytes_response(items.body(rest[1:]), headers=timing(result))


def _json_rows(name: str, rows: np.ndarray) -> Any:
    """One encoding's rows as the answer gives them: base64's as strings, the others as
    arrays orjson writes (copied: within a row of several encodings, one may be unaligned)."""
    if name == "base64":
        return [row.tobytes().decode("ascii") for row in rows]
    return np.ascontiguousarray(rows)


def _beyond_rows(result: EmbedResult) -> dict[str, list[Any]]:
    """A request's sparse rows ({indices, values}) and ColBERT vectors, where it asked."""
    rows: dict[str, list[Any]] = {}
    if result.sparse is not None:
        rows["sparse"] = [{"indices": row.indices, "values": row.values} for row in result.sparse]
    if result.colbert is not None:
        rows["colbert"] = result.colbert
    return rows


def _usage(result: EmbedResult) -> dict[str, int]:
    return {"prompt_tokens": result.tokens, "total_tokens": result.tokens}


async def list_models(state: ServerState, http: Request) -> Response:
    if http.url.path.endswith(b"/"):  # the router lets /v1/models/ through here: no name
        raise ModelNotFound("GET /v1/models/ names no model; GET /v1/models lists them")
    resident = {r.spec.name: r for r in state.registry.residents()}
    names = sorted(set(state.registry.catalog) | set(resident))
    data = [_model_card(state, name, resident, _owner(http)) for name in names]
    return json_response({"object": "list", "data": data})


async def retrieve_model(state: ServerState, http: Request) -> Response:
    """GET /v1/models/{model}: the OpenAI SDK's `models.retrieve`. Names like `org/model`
    arrive with their slash percent-encoded by the SDK, or as is from curl: both match."""
    name = http.route_values["model"] or ""  # always there: the route has {model}
    resident = {r.spec.name: r for r in state.registry.residents()}
    if name not in resident and name not in state.registry.catalog:
        raise ModelNotFound(
            f"model '{shown(name)}' is neither in this server's catalog nor loaded; "
            "GET /v1/models lists those",
            param="model",
        )
    return json_response(_model_card(state, name, resident, _owner(http)))


def _infinitys(http: Request) -> bool:
    """Whether the request came by infinity's paths, those without /v1."""
    return not http.path.startswith("/v1/")  # (`http.url` parses the URL: 5 us a request)


def _owner(http: Request) -> str:
    """The cards' `owned_by`: infinity's client takes no value but "infinity" on its paths,
    so they say that; OpenAI's say embedx."""
    return "infinity" if _infinitys(http) else "embedx"


def _model_card(
    state: ServerState, name: str, resident: dict[str, Resident], owner: str
) -> dict[str, Any]:
    """One model in OpenAI's shape (`protocol.openai.MODEL`), with what embedx knows of it and
    what infinity's cards carry (its client reads `stats`)."""
    entry = resident.get(name)
    engine = entry.engine if entry is not None else None
    spec = entry.spec if entry is not None else state.registry.catalog[name]
    card = {
        "id": name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": owner,
        "resident": engine is not None,
        "pooling": spec.pooling.value if spec.pooling else None,
        "dimensions": None,
        "backend": "",
        "capabilities": [],
        "stats": {},
    }
    if engine is not None:  # what a model is for and how it runs are known once it is loaded
        replicas = engine.replicas
        card.update(
            dimensions=engine.dimensions,
            backend=replicas[0].model.implementation if replicas else "",
            # infinity's names for a model's tasks: a scorer both reranks and classifies here
            capabilities=["rerank", "classify"] if engine.task.kind == "score" else ["embed"],
            stats={"queue_absolute": engine.queue.pending_items,
                   "queue_tokens": engine.queue.pending_tokens},
        )  # fmt: skip
    return card
