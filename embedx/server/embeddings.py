"""The embedding routes: OpenAI's /v1/embeddings and /v1/models, TEI's /embed."""

from __future__ import annotations

import base64

from blacksheep import Request, Response

from embedx.engine import EmbedOptions, EmbedResult
from embedx.server.responses import json_response
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
    if request.base64:  # little-endian float32, as the OpenAI SDK decodes it
        rows = [base64.b64encode(row.tobytes()).decode("ascii") for row in result.vectors]
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    else:
        data = [{"object": "embedding", "index": i, "embedding": row}
                for i, row in enumerate(result.vectors)]  # fmt: skip
    usage = {"prompt_tokens": result.tokens, "total_tokens": result.tokens}
    payload = {"object": "list", "data": data, "model": request.model, "usage": usage}
    return json_response(payload, headers=_timing(result))


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
    created = int(state.started_at)
    data = []
    for name in names:
        entry = resident.get(name)
        engine = entry.engine if entry is not None else None
        spec = entry.spec if entry is not None else state.registry.catalog[name]
        data.append(
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "embedx",
                "resident": engine is not None,
                "pooling": spec.pooling.value if spec.pooling else None,
                "dimensions": engine.dimensions if engine is not None else None,
            }
        )
    return json_response({"object": "list", "data": data})
