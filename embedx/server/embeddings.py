"""The embedding routes: OpenAI's /v1/embeddings and /v1/models, TEI's /embed."""

from __future__ import annotations

import binascii
from typing import Any

import numpy as np
import orjson
from blacksheep import Request, Response

from embedx.engine import EmbedOptions, EmbedResult
from embedx.errors import ModelNotFound
from embedx.registry import Resident
from embedx.server.responses import json_bytes_response, json_response
from embedx.server.state import ServerState
from embedx.server.validation import EmbedRequest, parse_openai, parse_tei


async def _run(state: ServerState, request: EmbedRequest) -> EmbedResult:
    """Wait for a slot, lease the model (loading it on first use), embed."""
    options = EmbedOptions(
        dimensions=request.dimensions,
        normalize=request.normalize,
        truncate=request.truncate,
        input_type=request.input_type,
    )
    async with state.admission.slot(), state.registry.lease(request.model, request.load) as engine:
        return await engine.embed(request.texts, options)


async def create_embeddings(state: ServerState, http: Request) -> Response:
    request = parse_openai(await http.read() or b"", state.settings.max_request_items)
    result = await _run(state, request)
    usage = {"prompt_tokens": result.tokens, "total_tokens": result.tokens}
    if not request.base64:
        data = [{"object": "embedding", "index": i, "embedding": row}
                for i, row in enumerate(result.vectors)]  # fmt: skip
        payload = {"object": "list", "data": data, "model": request.model, "usage": usage}
        return json_response(payload, headers=_timing(result))
    # The SDK's default, and the bulk of a busy server's responses: written as bytes around
    # the base64 rows (which need no JSON escaping) rather than as one string object each.
    items = b",".join(
        b'{"object":"embedding","index":%d,"embedding":"%s"}' % (i, row)
        for i, row in enumerate(base64_rows(result.vectors))
    )
    rest = orjson.dumps({"model": request.model, "usage": usage})  # {"model":...,"usage":...}
    body = b'{"object":"list","data":[' + items + b"]," + rest[1:]
    return json_bytes_response(body, headers=_timing(result))


def base64_rows(vectors: np.ndarray) -> list[bytes]:
    """Each row as base64 of its little-endian float32 bytes, as the OpenAI SDK decodes it."""
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    width = rows.shape[1] * 4
    if width % 3:  # rows end mid-quantum: each needs its own encoding
        return [binascii.b2a_base64(row.data, newline=False) for row in rows]
    # Rows are whole base64 quanta (384, 768, 1024 dimensions...): encode all at once, then cut.
    encoded = binascii.b2a_base64(rows.data, newline=False)
    step = width // 3 * 4
    return [encoded[i : i + step] for i in range(0, len(encoded), step)]


async def embed_tei(state: ServerState, http: Request) -> Response:
    request = parse_tei(await http.read() or b"", state.settings.max_request_items)
    result = await _run(state, request)
    return json_response(result.vectors, headers=_timing(result))


def _timing(result: EmbedResult) -> dict[str, str]:
    """TEI's timing headers, in milliseconds: where a request's time went."""
    return {
        "x-tokenization-time": f"{result.tokenize_s * 1000:.1f}",
        "x-inference-time": f"{(result.total_s - result.tokenize_s) * 1000:.1f}",
        "x-total-time": f"{result.total_s * 1000:.1f}",
        "x-total-tokens": str(result.tokens),
    }


async def list_models(state: ServerState, http: Request) -> Response:
    resident = {r.spec.name: r for r in state.registry.residents()}
    names = sorted(set(state.registry.catalog) | set(resident))
    data = [_model_card(state, name, resident) for name in names]
    return json_response({"object": "list", "data": data})


async def retrieve_model(state: ServerState, http: Request) -> Response:
    """GET /v1/models/{model}: the OpenAI SDK's `models.retrieve`. Names like `org/model`
    arrive with their slash percent-encoded by the SDK, or as is from curl: both match."""
    name = http.route_values["model"]
    resident = {r.spec.name: r for r in state.registry.residents()}
    if name not in resident and name not in state.registry.catalog:
        raise ModelNotFound(
            f"model {name!r} is neither in this server's catalog nor loaded; "
            "GET /v1/models lists those",
            param="model",
        )
    return json_response(_model_card(state, name, resident))


def _model_card(state: ServerState, name: str, resident: dict[str, Resident]) -> dict[str, Any]:
    """One model in OpenAI's shape, with what embedx knows of it."""
    entry = resident.get(name)
    engine = entry.engine if entry is not None else None
    spec = entry.spec if entry is not None else state.registry.catalog[name]
    return {
        "id": name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "embedx",
        "resident": engine is not None,
        "pooling": spec.pooling.value if spec.pooling else None,
        "dimensions": engine.dimensions if engine is not None else None,
    }
