"""The embedding routes: OpenAI's /v1/embeddings and /v1/models, TEI's /embed."""

from __future__ import annotations

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
        base64=request.base64,
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
    # The SDK's default, and the bulk of a busy server's responses: the engine hands back
    # each row as base64 already (made on the device), and the items are written around them
    # with a few array copies, not a Python object per row.
    rest = orjson.dumps({"model": request.model, "usage": usage})  # {"model":...,"usage":...}
    body = b"".join((b'{"object":"list","data":[', *base64_items(result.vectors), b"],", rest[1:]))
    return json_bytes_response(body, headers=_timing(result))


ITEM_HEAD = np.frombuffer(b'{"object":"embedding","index":', np.uint8)
ITEM_MID = np.frombuffer(b',"embedding":"', np.uint8)
ITEM_END = np.frombuffer(b'"},', np.uint8)
_ITEM_FRAME = len(ITEM_HEAD) + len(ITEM_MID) + len(ITEM_END)


def base64_items(rows: np.ndarray) -> list[memoryview]:
    """The `data` list's items, comma-separated, around (N, L) uint8 rows of base64: a
    fixed-width array for the rows whose indices have as many digits (0-9, 10-99, ...)."""
    blocks = []
    start, digits = 0, 1
    while start < len(rows):
        stop = min(len(rows), 10**digits)
        block = np.empty((stop - start, _ITEM_FRAME + digits + rows.shape[1]), np.uint8)
        at = len(ITEM_HEAD)
        block[:, :at] = ITEM_HEAD
        index = np.arange(start, stop)
        for power in range(digits - 1, -1, -1):  # the most significant digit first
            block[:, at] = ord("0") + index // 10**power % 10
            at += 1
        block[:, at : at + len(ITEM_MID)] = ITEM_MID
        block[:, at + len(ITEM_MID) : -len(ITEM_END)] = rows[start:stop]
        block[:, -len(ITEM_END) :] = ITEM_END
        blocks.append(block.reshape(-1).data)
        start, digits = stop, digits + 1
    blocks[-1] = blocks[-1][:-1]  # no comma after the last item
    return blocks


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
