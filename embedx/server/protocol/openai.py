"""OpenAI's embeddings API on the wire (and infinity's paths for it): the request table and
its parser, the responses' shapes (a base64 one laid out before its rows exist), and the
description of its operations."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from embedx.engine.outputs import ENCODINGS
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
    refuse_unknown,
)
from embedx.server.protocol.fields import Choice, Choices, Integer, Text
from embedx.server.protocol.schema import EXAMPLE_MODEL, Described, embedding, operation

# Beyond a dense row's encodings: a sparse row, BGE-M3's ColBERT vectors (engine/sparse_rows.py)
ROWS_BEYOND = ("sparse", "colbert")
OPENAI = Family("input", defaultable=False, closed=True, options={
    "encoding_format": Choice((*ENCODINGS, "sparse"), default="float"),
    "embedding_types": Choices((*ENCODINGS, *ROWS_BEYOND)),
    "top_k": Integer(1),
    "user": Text(),
    "input_type": PROMPT_NAME,
    **SHARED,
}, notes={
    "model": "A catalog name (GET /v1/models), a Hugging Face repo id or a local directory.",
    "encoding_format": "base64: the little-endian float32 bytes. int8, uint8, binary, "
                       "ubinary: a list of integers, as sentence-transformers' "
                       "quantize_embeddings makes them (int8 and uint8 over the fixed range "
                       "[-1, 1]; binary and ubinary a byte per 8 dimensions), after the "
                       "dimensions cut and normalizing (docs/api.md). sparse: a sparse row, "
                       "{indices, values} (a SPLADE model's, or BGE-M3's).",
    "embedding_types": "Cohere's: several encodings at once; each item's embedding is then "
                       "an object with one key per type. It replaces encoding_format (which "
                       "the OpenAI SDK sends on its own). sparse and colbert (BGE-M3's "
                       "token vectors) beside float ask a model for several rows at once.",
    "top_k": "embedx's: a sparse row keeps its k largest weights. Unset: every weight above 0.",
    "input_type": PROMPT_NOTE,
    **SHARED_NOTES,
})  # fmt: skip

# infinity's path for it: its client sends `modality` and `dimensions: 0` (the model's width)
INFINITY = Family("input", defaultable=False, closed=True, options={
    **OPENAI.options,
    "dimensions": Integer(0),
    "modality": Choice(("text",)),
}, notes={
    **OPENAI.notes,
    "dimensions": f"0 (infinity's default) keeps them all. {SHARED_NOTES['dimensions']}",
    "modality": "infinity's: embedx embeds text.",
})  # fmt: skip


def parse_openai(body: bytes, max_items: int, family: Family = OPENAI) -> EmbedRequest:
    """POST /v1/embeddings, as the OpenAI API defines it, plus embedx's load fields (or
    POST /embeddings, as infinity's client sends it, with `family` INFINITY)."""
    data = json_object(body)
    refuse_unknown(data, family)
    options = read_options(data, family)
    options["dimensions"] = options["dimensions"] or None  # infinity's 0: all of them
    kinds = options["embedding_types"] or (options["encoding_format"],)
    encodings = tuple(kind for kind in kinds if kind in ENCODINGS)
    beyond = tuple(kind for kind in ROWS_BEYOND if kind in kinds)
    return embed_request(
        data,
        family,
        options,
        max_items,
        model=read_model(data, family, None),
        input_type=options["input_type"],
        encodings=encodings or ("float",),
        keyed=options["embedding_types"] is not None,
        outputs=("dense", *beyond) if encodings else beyond,
        top_k=options["top_k"],
    )


def _integers(low: int, high: int) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "integer", "minimum": low, "maximum": high}}


# One row in each encoding, as the answer gives it
ROW: dict[str, dict[str, Any]] = {
    "float": {"type": "array", "items": {"type": "number"}},
    "base64": {"type": "string", "contentEncoding": "base64"},
    "int8": _integers(-128, 127),
    "uint8": _integers(0, 255),
    "binary": _integers(-128, 127),
    "ubinary": _integers(0, 255),
    "sparse": {"type": "object", "required": ["indices", "values"], "properties": {
        "indices": {"type": "array", "items": {"type": "integer"},
                    "description": "Token ids, ascending"},
        "values": {"type": "array", "items": {"type": "number"}}}},
    "colbert": {"type": "array", "items": {"type": "array", "items": {"type": "number"}},
                "description": "A vector a token after the first"},
}  # fmt: skip
RESPONSE = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "model": {"type": "string"},
        "data": {"type": "array", "items": {
            "type": "object", "required": ["object", "index", "embedding"], "properties": {
                "object": {"const": "embedding"}, "index": {"type": "integer"},
                "embedding": {"anyOf": [*ROW.values(), {
                    "type": "object", "properties": ROW, "additionalProperties": False,
                    "description": "With embedding_types: a row a type."}]}}}},
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"],
                  "properties": {"prompt_tokens": {"type": "integer"},
                                 "total_tokens": {"type": "integer"}}},
    },
}  # fmt: skip
MODEL = {  # OpenAI's card, with embedx's fields and infinity's (its client needs `stats`)
    "type": "object",
    "required": ["id", "object", "created", "owned_by", "resident", "pooling", "dimensions",
                 "backend", "capabilities", "stats"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
        "owned_by": {"enum": ["embedx", "infinity"],
                     "description": "infinity on infinity's paths, as its client requires"},
        "resident": {"type": "boolean"},
        "pooling": {"enum": ["cls", "mean", "last_token", "splade", None]},
        "dimensions": {"type": ["integer", "null"], "description": "null until loaded"},
        "backend": {"type": "string", "description": "the implementation; empty until loaded"},
        "capabilities": {"type": "array", "items": {"enum": ["embed", "rerank", "classify"]},
                         "description": "as infinity names them; empty until loaded"},
        "stats": {"type": "object", "description": "empty until loaded", "properties": {
            "queue_absolute": {"type": "integer", "description": "texts or pairs queued"},
            "queue_tokens": {"type": "integer", "description": "their tokens"}}},
    },
}  # fmt: skip
MODELS = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL}},
}


def operations(server: Described) -> dict[str, dict[str, Any]]:
    """The family's paths as the OpenAPI document describes them, infinity's among them."""
    paths: dict[str, dict[str, Any]] = {
        "/v1/embeddings": {"post": embedding(
            "Create embeddings (OpenAI)", RESPONSE, OPENAI, server)},
        "/v1/models": {"get": operation(
            "Models resident and in the catalog (OpenAI)", MODELS, keyed=server.keyed)},
        "/v1/models/{model}": {"get": {**operation(
            "One model, resident or in the catalog (OpenAI)", MODEL, errors=(404,),
            keyed=server.keyed),
            "parameters": [{"name": "model", "in": "path", "required": True,
                            "schema": {"type": "string"}, "example": EXAMPLE_MODEL,
                            "description": "Slashes as they are or percent-encoded."}]}},
    }  # fmt: skip
    for path in list(paths):  # as infinity serves them: its clients' base URL has no /v1
        paths[path.removeprefix("/v1")] = {
            method: {**described, "summary": f"As {path}: infinity's path (a base URL without /v1)"}
            for method, described in paths[path].items()
        }
    paths["/embeddings"]["post"] = embedding(
        "As /v1/embeddings, with what infinity's client sends: infinity's path", RESPONSE,
        INFINITY, server)  # fmt: skip
    return paths


ITEM_HEAD = b'{"object":"embedding","index":'
ITEM_MID = b',"embedding":"'
ITEM_END = np.frombuffer(b'"},', np.uint8)


class Base64Items:
    """The `data` list of a base64 response, one fixed-width line of bytes per item, made
    before the rows exist: as the request's `EmbedOptions.sink`, it hands the engine the column
    each row's base64 goes in, so a row is copied once from the device's buffer to the body.

    An index with fewer digits than the last is preceded by spaces, between the items, so
    that every row's base64 starts in the same column."""

    def __init__(self) -> None:
        self._lines: np.ndarray | None = None

    def __call__(self, count: int, width: int) -> np.ndarray:
        heads = _item_heads(count)
        row_start = heads.shape[1]
        lines = np.empty((count, row_start + width + len(ITEM_END)), np.uint8)
        lines[:, :row_start] = heads
        lines[:, -len(ITEM_END) :] = ITEM_END
        self._lines = lines
        return lines[:, row_start : row_start + width]

    def body(self, rest: bytes) -> bytes:
        """The response: the items, then `rest`, the fields after `data` (from `"model"` on,
        with the closing brace)."""
        assert self._lines is not None, "the engine wrote no rows"
        items = self._lines.reshape(-1).data[:-1]  # no comma after the last item
        return b"".join((b'{"object":"list","data":[', items, b"],", rest))


@functools.lru_cache(maxsize=8)  # requests mostly come in a few sizes
def _item_heads(count: int) -> np.ndarray:
    """What precedes each of `count` items' base64, padded to one width."""
    width = len(ITEM_HEAD) + len(str(count - 1)) + len(ITEM_MID)
    heads = b"".join((b"%s%d%s" % (ITEM_HEAD, i, ITEM_MID)).rjust(width) for i in range(count))
    return np.frombuffer(heads, np.uint8).reshape(count, width)
