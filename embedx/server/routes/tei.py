"""text-embeddings-inference's routes: POST /embed (and POST /, where TEI serves it too),
/embed_sparse, /tokenize and /decode."""

from __future__ import annotations

import orjson
from blacksheep import Request, Response

from embedx.engine import tokens
from embedx.errors import InvalidInput, InvalidOption
from embedx.registry import LoadRequest
from embedx.server.protocol.tei import (
    parse_decode,
    parse_tei,
    parse_tei_sparse,
    parse_tokenize,
    tei_default,
)
from embedx.server.responses import json_bytes_response, json_response
from embedx.server.routes.embedding import embed, json_body, timing
from embedx.server.state import ServerState

ANY_TASK = LoadRequest(task=None)  # an embedder's tokens, or a scorer's


async def embed_tei(state: ServerState, http: Request) -> Response:
    settings = state.settings
    request = parse_tei(await json_body(http), settings.max_request_items, tei_default(settings))
    try:
        result = await embed(state, request)
    except (InvalidInput, InvalidOption) as exc:
        if exc.param != "input_type":
            raise
        raise type(exc)(exc.message, param="prompt_name") from None  # TEI's name for it
    return json_response(result.vectors, headers=timing(result))


async def embed_sparse_tei(state: ServerState, http: Request) -> Response:
    settings = state.settings
    body = await json_body(http)
    request = parse_tei_sparse(body, settings.max_request_items, tei_default(settings))
    result = await embed(state, request)
    rows = [[{"index": i, "value": v} for i, v in zip(row.indices.tolist(), row.values.tolist(),
                                                      strict=True)]
            for row in result.sparse or ()]  # fmt: skip
    return json_response(rows, headers=timing(result))


async def tokenize_tei(state: ServerState, http: Request) -> Response:
    settings = state.settings
    max_items = settings.max_request_items
    request = parse_tokenize(await json_body(http), max_items, tei_default(settings))
    admitted = state.admission.slot(len(request.texts))
    async with state.registry.lease(request.model, ANY_TASK) as engine, admitted:
        tokenized = await tokens.tokenize(
            engine,
            request.texts,
            special=request.add_special_tokens,
            input_type=request.prompt_name,
            max_texts=max_items,
        )
    return json_bytes_response(orjson.dumps(tokenized))  # each Token as an object


async def decode_tei(state: ServerState, http: Request) -> Response:
    settings = state.settings
    request = parse_decode(await json_body(http), settings.max_request_items, tei_default(settings))
    admitted = state.admission.slot(len(request.ids))
    async with state.registry.lease(request.model, ANY_TASK) as engine, admitted:
        texts = await tokens.decode(engine, request.ids, skip_special=request.skip_special_tokens)
    return json_response(texts)
