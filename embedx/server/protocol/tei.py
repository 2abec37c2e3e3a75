"""text-embeddings-inference's API on the wire: the request table and its parser, the model
of requests that name none, the response's shape and the description of its operations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedx.config import Settings
from embedx.errors import EmptyInput, InvalidInput
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
    read_texts,
    request_schema,
    within_items,
)
from embedx.server.protocol.fields import Choice, Flag, Integer
from embedx.server.protocol.schema import EMBEDDING, EXAMPLE_MODEL, Described, embedding, operation

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


# POST /embed_sparse: TEI's request for a SPLADE model's rows (TEI reads no normalize), with
# embedx's top_k; no dimensions, which a vocabulary-wide row has no use for
TEI_SPARSE = Family("inputs", defaultable=True, closed=False, options={
    "truncate": TEI.options["truncate"],
    "truncation_direction": TEI.options["truncation_direction"],
    "prompt_name": PROMPT_NAME,
    "top_k": Integer(1),
    **{key: option for key, option in SHARED.items() if key != "dimensions"},
}, notes={
    **{key: note for key, note in TEI.notes.items() if key not in ("normalize", "dimensions")},
    "top_k": "embedx's: each row keeps its k largest weights. Unset: every weight above 0.",
})  # fmt: skip


def parse_tei_sparse(body: bytes, max_items: int, default_model: str | None) -> EmbedRequest:
    """POST /embed_sparse, as TEI defines it: a SPLADE model's sparse rows (or BGE-M3's)."""
    data = json_object(body)
    options = {**read_options(data, TEI_SPARSE), "dimensions": None}
    return embed_request(
        data,
        TEI_SPARSE,
        options,
        max_items,
        model=read_model(data, TEI_SPARSE, default_model),
        input_type=options["prompt_name"],
        truncate=options["truncate"],
        outputs=("sparse",),
        top_k=options["top_k"],
    )


EXAMPLE_SPARSE_MODEL = "naver/efficient-splade-VI-BT-large-query"  # TEI's own example
VECTORS = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
SPARSE_VECTORS = {"type": "array", "items": {"type": "array", "items": {
    "type": "object", "required": ["index", "value"], "properties": {
        "index": {"type": "integer", "description": "A token id"},
        "value": {"type": "number", "description": "Its weight, above 0"}}}},
    "description": "Each input's non-zero weights, by token id (ascending)"}  # fmt: skip

MODEL_NOTE = TEI.notes["model"]
TOKENIZE = Family("inputs", defaultable=True, closed=False, options={
    "add_special_tokens": Flag(default=True),
    "prompt_name": TEI.options["prompt_name"],
}, notes={
    "model": MODEL_NOTE,
    "inputs": "Tokenized whole, not truncated, each as its embedding would be prompted.",
    "prompt_name": "The model's prompt for the texts; unset, its default prompt if any.",
})  # fmt: skip
DECODE = Family("ids", defaultable=True, closed=False, options={
    "skip_special_tokens": Flag(default=True),
}, notes={"model": MODEL_NOTE})  # fmt: skip
MAX_ID = 2**32 - 1  # TEI's ids are u32


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    model: str
    texts: list[str]
    add_special_tokens: bool
    prompt_name: str | None


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    model: str
    ids: list[list[int]]
    skip_special_tokens: bool


def parse_tokenize(body: bytes, max_items: int, default_model: str | None) -> TokenizeRequest:
    """POST /tokenize, as TEI defines it; a request naming no model goes to `default_model`."""
    data = json_object(body)
    options = read_options(data, TOKENIZE)
    return TokenizeRequest(
        model=read_model(data, TOKENIZE, default_model),
        texts=read_texts(data, TOKENIZE, max_items),
        add_special_tokens=options["add_special_tokens"],
        prompt_name=options["prompt_name"],
    )


def parse_decode(body: bytes, max_items: int, default_model: str | None) -> DecodeRequest:
    """POST /decode, as TEI defines it: `ids`, one list of token ids or a list of them."""
    data = json_object(body)
    options = read_options(data, DECODE)
    return DecodeRequest(
        model=read_model(data, DECODE, default_model),
        ids=_ids(data.get("ids"), max_items),
        skip_special_tokens=options["skip_special_tokens"],
    )


def _ids(value: Any, max_items: int) -> list[list[int]]:
    if value is None:
        raise EmptyInput("`ids` is required: a list of token ids, or a list of them", param="ids")
    if not isinstance(value, list):
        raise InvalidInput("`ids` must be a list of token ids, or a list of them", param="ids")
    if not value:
        raise EmptyInput("`ids` is empty: send at least one token id", param="ids")
    rows = value if isinstance(value[0], list) else [value]
    within_items(rows, "ids", max_items, noun="lists")
    return [_row(row, i) for i, row in enumerate(rows)]


def _row(row: Any, at: int) -> list[int]:
    if not isinstance(row, list) or not row:
        raise InvalidInput(f"`ids[{at}]` must be a non-empty list of token ids", param="ids")
    if set(map(type, row)) == {int} and min(row) >= 0 and max(row) <= MAX_ID:
        return row  # the usual list, checked without a Python step an id
    ids = []
    for token in row:
        if isinstance(token, float) and token.is_integer():
            token = int(token)  # JSON Schema's integer, as `Integer` reads it
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= MAX_ID:
            raise InvalidInput(
                f"`ids[{at}]` holds {token!r}: a token id is an integer from 0 to {MAX_ID}",
                param="ids",
            )
        ids.append(token)
    return ids


TOKENS = {"type": "array", "description": "Each input's tokens", "items": {
    "type": "array", "items": {
        "type": "object", "required": ["id", "text", "special", "start", "stop"],
        "properties": {
            "id": {"type": "integer"}, "text": {"type": "string"}, "special": {"type": "boolean"},
            "start": {"type": ["integer", "null"],
                      "description": "In the text's UTF-8 bytes (its prompt's included); "
                                     "null for a special token"},
            "stop": {"type": ["integer", "null"]}}}}}  # fmt: skip
TEXTS = {"type": "array", "items": {"type": "string"}, "description": "Each list's text"}


def _decode_schema(server: Described) -> dict[str, Any]:
    schema = request_schema(DECODE, max_items=server.max_items, default_model=server.default_model)
    token = {"type": "integer", "minimum": 0, "maximum": MAX_ID}
    one = {"type": "array", "items": token, "minItems": 1}
    schema["properties"]["ids"] = {
        "anyOf": [
            one,
            {"type": "array", "items": one, "minItems": 1, "maxItems": server.max_items},
        ],
        "description": "Token ids, or lists of them; each must be in the model's vocabulary.",
    }
    return schema


def _tokens_operations(server: Described) -> dict[str, dict[str, Any]]:
    tokenize = {
        "schema": request_schema(
            TOKENIZE, max_items=server.max_items, default_model=server.default_model
        ),
        "example": {"model": EXAMPLE_MODEL, "inputs": ["The food was delicious."]},
    }
    decode = {
        "schema": _decode_schema(server),
        "example": {"model": EXAMPLE_MODEL, "ids": [[101, 7592, 2088, 102]]},
    }
    return {
        "/tokenize": {"post": operation("Tokenize (text-embeddings-inference)", TOKENS,
                                        keyed=server.keyed, errors=EMBEDDING, request=tokenize)},
        "/decode": {"post": operation("Decode token ids (text-embeddings-inference)", TEXTS,
                                      keyed=server.keyed, errors=EMBEDDING, request=decode)},
    }  # fmt: skip


def operations(server: Described) -> dict[str, dict[str, Any]]:
    """The family's paths as the OpenAPI document describes them."""
    return {
        "/embed": {"post": embedding("Embed (text-embeddings-inference)", VECTORS, TEI, server)},
        "/embed_sparse": {
            "post": embedding(
                "Sparse rows (text-embeddings-inference)",
                SPARSE_VECTORS,
                TEI_SPARSE,
                server,
                EXAMPLE_SPARSE_MODEL,
            )
        },
        "/": {
            "post": embedding("As /embed: TEI serves its model's task here", VECTORS, TEI, server)
        },
        **_tokens_operations(server),
    }
