"""text-embeddings-inference's API on the wire: the request table and its parser, the model
of requests that name none, the response's shape and the description of its operations."""

from __future__ import annotations

from typing import Any

from embedx.config import Settings
from embedx.server.protocol.family import (
    PROMPT_NAME,
    PROMPT_NOTE,
    SHARED,
    SHARED_NOTES,
    EmbedRequest,
    Family,
    embed_request,
    json_object,
    read_model,
    read_options,
)
from embedx.server.protocol.fields import Choice, Flag
from embedx.server.protocol.schema import Described, embedding

# TEI ignores fields it does not read: the Inference API's `options` and `parameters`,
# which older clients send, and `input_type`, which other APIs' clients send (TEI's own
# field for it is `prompt_name`).
TEI = Family("inputs", defaultable=True, closed=False, options={
    "normalize": Flag(),  # unset: EMBEDX_NORMALIZE
    "truncate": Flag(default=False),
    "truncation_direction": Choice(("right", "Right")),  # null: right, TEI's default
    "prompt_name": PROMPT_NAME,
    **SHARED,
}, notes={
    "model": "Unset, null or blank: EMBEDX_DEFAULT_MODEL, else the first of EMBEDX_PRELOAD "
             "(TEI's clients name no model); required where the server has neither.",
    "prompt_name": PROMPT_NOTE,
    "normalize": "Unset: EMBEDX_NORMALIZE (true).",
    "truncate": "false: a text over max_seq_len is a 400.",
    "truncation_direction": "Only right truncation.",
    **SHARED_NOTES,
})  # fmt: skip


def tei_default(settings: Settings) -> str | None:
    """The model of TEI requests that name none: EMBEDX_DEFAULT_MODEL, else the first of
    EMBEDX_PRELOAD."""
    return settings.default_model or next(iter(settings.preload), None)


def parse_tei(body: bytes, max_items: int, default_model: str | None) -> EmbedRequest:
    """POST /embed, as text-embeddings-inference defines it: a request without `model`
    (TEI serves one model, so its clients send none) goes to `default_model`, and
    `prompt_name` picks the model's prompt. Other fields (`input_type` among them) are
    ignored, as TEI ignores them."""
    data = json_object(body)
    options = read_options(data, TEI)
    return embed_request(
        data,
        TEI,
        options,
        max_items,
        model=read_model(data, TEI, default_model),
        input_type=options["prompt_name"],
        normalize=options["normalize"],
        truncate=options["truncate"],
    )


VECTORS = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}


def operations(server: Described) -> dict[str, dict[str, Any]]:
    """The family's paths as the OpenAPI document describes them."""
    return {
        "/embed": {"post": embedding("Embed (text-embeddings-inference)", VECTORS, TEI, server)},
        "/": {
            "post": embedding("As /embed: TEI serves its model's task here", VECTORS, TEI, server)
        },
    }
