"""text-embeddings-inference's route: POST /embed (and POST /, where TEI serves it too)."""

from __future__ import annotations

from blacksheep import Request, Response

from embedx.errors import InvalidInput, InvalidOption
from embedx.server.protocol.tei import parse_tei, tei_default
from embedx.server.responses import json_response
from embedx.server.routes.embedding import embed, json_body, timing
from embedx.server.state import ServerState


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
