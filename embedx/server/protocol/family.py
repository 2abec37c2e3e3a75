"""An embedding API family's request body as one table (its model, its texts, its options),
and the one parser and the one JSON Schema both read from it: everything past the parser
receives typed, validated values."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from embedx.engine.outputs import FLOAT
from embedx.engine.texts import plain_texts
from embedx.errors import (
    EmptyInput,
    InvalidInput,
    InvalidJSON,
    InvalidOption,
    TokenInputNotSupported,
    TooManyItems,
    UnsupportedMediaType,
)
from embedx.models.catalog import DTYPES
from embedx.models.pooling import Pooling
from embedx.models.prompts import INPUT_TYPES, MAX_INSTRUCTION
from embedx.registry import LoadRequest
from embedx.server.protocol.fields import Choice, Duration, Integer, Option, Text
from embedx.untrusted import shown

MAX_NAMED_FIELDS = 5  # of the unknown fields a message lists
# Longer than any real path or repo id (the hub's are 96 at most). In characters, as JSON
# Schema's maxLength counts, so that the document states the very bound checked here.
MAX_MODEL_NAME = 1024
# Control characters (Unicode's Cc): no repo id or catalog name has one. Written alike for
# Python's `re` and the document's ECMA-262 patterns: no shorthand whose meaning differs.
CONTROL = r"\x00-\x1f\x7f-\x9f"
CONTROL_CHARACTER = re.compile(f"[{CONTROL}]")
MAX_PROMPT_NAME = 256  # characters: an input type, or a name of a model's own prompts


@dataclass(frozen=True, slots=True)
class Family:
    """An API family's request body: its model, its texts and its options (each optional;
    null means unset, as serializers of optional fields send it), and what each field means
    (`notes`, for the document)."""

    texts: str  # the field holding the texts
    defaultable: bool  # a request naming no model (null, or blank) gets the server's default
    closed: bool  # unknown fields are refused (else ignored)
    options: dict[str, Option]
    notes: dict[str, str] = field(default_factory=dict)

    def fields(self) -> set[str]:
        return {"model", self.texts, *self.options}


# An input type (`INPUT_TYPES`) or a prompt of the model's own: which, only the model knows
PROMPT_NAME = Text(1, MAX_PROMPT_NAME)
PROMPT_NOTE = ("The model's prompt for the texts: " + ", ".join(INPUT_TYPES)
               + " (docs/api.md says which prompt each takes), or any prompt name of its own "
               "(its catalog entry's, else its sentence-transformers config's); another is a "
               "400 naming those the model takes.")  # fmt: skip
SHARED: dict[str, Option] = {  # both embedding families'
    "dimensions": Integer(1),
    "instruction": Text(longest=MAX_INSTRUCTION),
    "pooling": Choice(tuple(p.value for p in Pooling)),
    "dtype": Choice(DTYPES),
    "max_seq_len": Integer(2),  # a text's tokens with its special ones: two at least
    "keep_alive": Duration(),
}
SHARED_NOTES = {
    "dimensions": "Matryoshka: keep the first N dimensions, renormalized; at most the "
                  "model's own width.",
    "instruction": "Fills the {instruction} slot of the model's query prompt (the "
                   "instruct families', or a catalog entry's); with no input_type, the texts "
                   "are queries. Unset: the model's default_instruction. A model without a "
                   "slot is a 400.",
    "pooling": "Required on a model's first load unless the catalog states it; never "
               "guessed. A different pooling for a loaded model is a 409.",
    "dtype": "First load only. auto: bfloat16 on GPUs that have it, float16 on older GPUs, "
             "float32 on the CPU.",
    "max_seq_len": "Tokens kept per text (longer texts are truncated and counted). Sets it on "
                   "a model's first load; afterwards it must be the model's.",
    "keep_alive": "First load only: idle time before unloading, seconds or a duration like "
                  "10m; 0 unloads when the last user leaves.",
}  # fmt: skip


def request_schema(family: Family, *, max_items: int, default_model: bool) -> dict[str, Any]:
    """The JSON Schema of a family's request body, as the parser below reads it, on a server
    taking `max_items` texts a request and with (`default_model`) or without a model for
    requests that name none."""
    text = {"type": "string", "minLength": 1}
    model = {"type": "string", "maxLength": MAX_MODEL_NAME, "pattern": f"^[^{CONTROL}]*$"}
    required = not (family.defaultable and default_model)
    properties: dict[str, Any] = {
        "model": {**model, "minLength": 1} if required else _nullable(model),
        family.texts: {"oneOf": [text, {"type": "array", "items": text,
                                        "minItems": 1, "maxItems": max_items}]},
    }  # fmt: skip
    for key, option in family.options.items():
        schema = _nullable(option.schema())
        if option.default is not None:
            schema["default"] = option.default
        properties[key] = schema
    for key, note in family.notes.items():
        properties[key]["description"] = note  # a note on no field fails here
    schema = {"type": "object", "properties": properties,
              "required": ["model", family.texts] if required else [family.texts]}  # fmt: skip
    if family.closed:
        schema["additionalProperties"] = False
    else:
        schema["description"] = "Fields other than these are ignored, as TEI ignores them."
    return schema


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if "anyOf" in schema:
        return {"anyOf": [*schema["anyOf"], {"type": "null"}]}
    nullable = {**schema, "type": [schema["type"], "null"]}
    if "enum" in schema:
        nullable["enum"] = [*schema["enum"], None]
    return nullable


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    model: str
    texts: list[str]
    load: LoadRequest
    dimensions: int | None = None
    input_type: str | None = None
    instruction: str | None = None
    encodings: tuple[str, ...] = FLOAT  # OpenAI: encoding_format, or embedding_types
    keyed: bool = False  # OpenAI: each row an object keyed by encoding (embedding_types)
    normalize: bool | None = None  # TEI
    truncate: bool = True  # TEI: false makes an over-long text an error
    outputs: tuple[str, ...] = ("dense",)  # with sparse rows or ColBERT vectors (sparse_rows)
    top_k: int | None = None  # a sparse row's largest weights kept


def check_json_body(content_type: bytes | None, content_encoding: bytes | None) -> None:
    """A body is JSON, labelled so, and not compressed. The label matters beyond form: a
    browser sends a `text/plain` or unlabelled body cross-origin without asking first."""
    if content_encoding is not None and content_encoding.strip().lower() != b"identity":
        raise UnsupportedMediaType(
            f"the body is {shown(content_encoding.decode('latin-1'))}-encoded; embedx reads bodies "
            "uncompressed: send it without Content-Encoding"
        )
    media = (content_type or b"").partition(b";")[0].strip().lower()
    if media != b"application/json" and not (
        media.startswith(b"application/") and media.endswith(b"+json") and len(media) > 17
    ):  # 17: application/+json, which names no type
        given = f"`{shown(media.decode('latin-1'))}`" if media else "none"
        raise UnsupportedMediaType(
            f"send the body as JSON with `Content-Type: application/json` (the request had {given})"
        )


def json_object(body: bytes) -> dict[str, Any]:
    if not body:
        raise InvalidJSON("the request body is empty: send a JSON object")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidJSON("the request body must be a JSON object")
    return data


def refuse_unknown(data: dict[str, Any], family: Family) -> None:
    """A closed family's request holds no field the family lacks."""
    extra = sorted(set(data) - family.fields())
    if extra:
        names = ", ".join(shown(name) for name in extra[:MAX_NAMED_FIELDS])
        more = f" and {len(extra) - MAX_NAMED_FIELDS} more" if len(extra) > MAX_NAMED_FIELDS else ""
        raise InvalidOption(
            f"unrecognized request argument(s): {names}{more}", param=shown(extra[0])
        )


def read_model(data: dict[str, Any], family: Family, default: str | None) -> str:
    """The request's model, or (where the family takes one) the server's default for
    requests that name none."""
    model = data.get("model")
    if model in (None, "") and default is not None:  # TEI's clients may send it blank
        return default
    if model is not None and not isinstance(model, str):
        raise InvalidOption(f"`model` must be a string, not {_json_type(model)}", param="model")
    if not model:
        hint = (
            " (or start the server with EMBEDX_DEFAULT_MODEL, or a model in EMBEDX_PRELOAD, "
            "for requests that name none)"
            if family.defaultable
            else ""
        )
        raise InvalidOption(
            f"`model` is required: the name of the model to embed with{hint}", param="model"
        )
    return checked_model_name(model)


def checked_model_name(model: str) -> str:
    """A model name no longer than any real one, with no control character."""
    if len(model) > MAX_MODEL_NAME:
        raise InvalidOption(
            f"`model` is {len(model)} characters long; a model's name or path has at most "
            f"{MAX_MODEL_NAME}",
            param="model",
        )
    if (control := CONTROL_CHARACTER.search(model)) is not None:
        raise InvalidOption(
            f"`model` holds a control character (U+{ord(control[0]):04X}); no model's name or "
            "path has one",
            param="model",
        )
    return model


def read_options(data: dict[str, Any], family: Family) -> dict[str, Any]:
    """Each of the family's options, read, or its default where the request has none (or
    null)."""
    values: dict[str, Any] = {}
    for key, option in family.options.items():
        value = data.get(key)
        values[key] = option.default if value is None else option.read(value, key)
    return values


def embed_request(
    data: dict[str, Any],
    family: Family,
    options: dict[str, Any],
    max_items: int,
    *,
    model: str,
    input_type: str | None,
    **own: Any,
) -> EmbedRequest:
    """The fields both embedding families share, then each family's own (the model and the
    prompt each family finds its own way). A request for no dense rows loads a model whose
    files may state its pooling (a SPLADE SparseEncoder's)."""
    dense = "dense" in own.get("outputs", ("dense",))
    return EmbedRequest(
        model=model,
        texts=_texts(data.get(family.texts), family.texts, max_items),
        load=LoadRequest(
            pooling=options["pooling"],
            dtype=options["dtype"],
            max_seq_len=options["max_seq_len"],
            keep_alive_s=options["keep_alive"],
            task="embed" if dense else "sparse",
        ),
        dimensions=options["dimensions"],
        input_type=input_type,
        instruction=options["instruction"],
        **own,
    )


def within_items(items: list[Any], param: str, max_items: int, noun: str = "items") -> None:
    """TooManyItems where a request's `param` holds more than EMBEDX_MAX_REQUEST_ITEMS."""
    if len(items) > max_items:
        raise TooManyItems(
            f"`{param}` has {len(items)} {noun}; at most {max_items} are allowed per request "
            "(EMBEDX_MAX_REQUEST_ITEMS): split it",
            param=param,
        )


def read_texts(data: dict[str, Any], family: Family, max_items: int) -> list[str]:
    """The family's texts: a string, or a list of at most `max_items` strings, none empty."""
    return _texts(data.get(family.texts), family.texts, max_items)


def _texts(value: Any, param: str, max_items: int) -> list[str]:
    if value is None:
        raise EmptyInput(f"`{param}` is required: a string or a list of strings", param=param)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list):
        raise InvalidInput(f"`{param}` must be a string or a list of strings", param=param)
    if not texts:
        raise EmptyInput(f"`{param}` is empty: send at least one text", param=param)
    within_items(texts, param, max_items)
    if plain_texts(texts):
        return texts
    if all(_token_ids(item) for item in texts):
        # On the OpenAI route, the usual sender: LangChain's OpenAIEmbeddings, which
        # tokenizes with OpenAI's tiktoken vocabulary, whose ids mean nothing to another model.
        langchain = (
            " (LangChain's OpenAIEmbeddings sends OpenAI token ids unless "
            "check_embedding_ctx_length=False)"
            if param == "input"
            else ""
        )
        raise TokenInputNotSupported(
            f"`{param}` holds token ids; embedx embeds text: send the strings themselves, "
            f"it tokenizes them with the model's own tokenizer{langchain}",
            param=param,
        )
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInput(f"`{param}[{i}]` is {_json_type(text)}, not a string", param=param)
        if not text:
            raise InvalidInput(f"`{param}[{i}]` is an empty string", param=param)
    return texts


def _token_ids(item: Any) -> bool:
    """Whether an input item is what OpenAI takes as token ids: an int, or a list of them."""
    if isinstance(item, list):
        return bool(item) and all(_token_id(t) for t in item)
    return _token_id(item)


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    """A parsed JSON value's type, as JSON names it, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list) else "an object"
