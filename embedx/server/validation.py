"""Checking request bodies at the edge, one function per API family, each reading its
family's table of fields, from which the OpenAPI document takes its request schemas too:
everything past here receives typed, validated values."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from embedx.config import Settings
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
from embedx.models.catalog import DTYPES, INPUT_TYPES
from embedx.models.pooling import Pooling
from embedx.registry import LoadRequest
from embedx.untrusted import shown

MAX_NAMED_FIELDS = 5  # of the unknown fields a message lists
# Longer than any real path or repo id (the hub's are 96 at most). In characters, as JSON
# Schema's maxLength counts, so that the document states the very bound checked here.
MAX_MODEL_NAME = 1024
# Control characters (Unicode's Cc): no repo id or catalog name has one. Written alike for
# Python's `re` and the document's ECMA-262 patterns: no shorthand whose meaning differs.
CONTROL = r"\x00-\x1f\x7f-\x9f"
CONTROL_CHARACTER = re.compile(f"[{CONTROL}]")
DURATION = re.compile(r"^ *([0-9]+(?:\.[0-9]+)?) *([smh]?) *$")
MAX_DURATION = 32  # characters: a duration this long still counts finite seconds
SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True, slots=True)
class Choice:
    """One of a few strings."""

    values: tuple[str, ...]
    default: str | None = None

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values)}

    def read(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or value not in self.values:
            raise InvalidOption(f"`{key}` must be one of {', '.join(self.values)}", param=key)
        return value


@dataclass(frozen=True, slots=True)
class Integer:
    """A whole number, `minimum` or more (1.0 is one, as JSON Schema counts it)."""

    minimum: int
    default: None = None

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.minimum}

    def read(self, value: Any, key: str) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            raise InvalidOption(f"`{key}` must be an integer of {self.minimum} or more", param=key)
        return value


@dataclass(frozen=True, slots=True)
class Flag:
    """true or false."""

    default: bool | None = None

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}

    def read(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise InvalidOption(f"`{key}` must be true or false", param=key)
        return value


@dataclass(frozen=True, slots=True)
class Text:
    """Any string."""

    default: None = None

    def schema(self) -> dict[str, Any]:
        return {"type": "string"}

    def read(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise InvalidOption(f"`{key}` must be a string", param=key)
        return value


@dataclass(frozen=True, slots=True)
class Duration:
    """Seconds, as a number or a string like "90s", "10m", "1h"."""

    default: None = None

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [{"type": "number", "minimum": 0},
                          {"type": "string", "pattern": DURATION.pattern,
                           "maxLength": MAX_DURATION}]}  # fmt: skip

    def read(self, value: Any, key: str) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value)
        # fullmatch: `$` alone would let a trailing newline through, which ECMA's does not
        match = DURATION.fullmatch(value) if isinstance(value, str) else None
        if match and len(value) <= MAX_DURATION:
            return float(match.group(1)) * SECONDS[match.group(2)]
        raise InvalidOption(f"`{key}` must be seconds, or a duration like 90s, 10m, 1h", param=key)


Option = Choice | Integer | Flag | Text | Duration


@dataclass(frozen=True, slots=True)
class Family:
    """An API family's request body: its model, its texts and its options (each optional;
    null means unset, as serializers of optional fields send it)."""

    texts: str  # the field holding the texts
    defaultable: bool  # a request naming no model (null, or blank) gets the server's default
    closed: bool  # unknown fields are refused (else ignored)
    options: dict[str, Option]
    synonym: tuple[str, str] | None = None  # two choices of one thing: both given, they agree

    def fields(self) -> set[str]:
        return {"model", self.texts, *self.options}


SHARED: dict[str, Option] = {  # both families'
    "dimensions": Integer(1),
    "input_type": Choice(INPUT_TYPES),
    "pooling": Choice(tuple(p.value for p in Pooling)),
    "dtype": Choice(DTYPES),
    "max_seq_len": Integer(2),  # a text's tokens with its special ones: two at least
    "keep_alive": Duration(),
}
OPENAI = Family("input", defaultable=False, closed=True, options={
    "encoding_format": Choice(("float", "base64"), default="float"),
    "user": Text(),
    **SHARED,
})  # fmt: skip
# TEI ignores fields it does not read: the Inference API's `options` and `parameters`,
# which older clients send (`parse_tei`).
TEI = Family("inputs", defaultable=True, closed=False, options={
    "normalize": Flag(),  # unset: EMBEDX_NORMALIZE
    "truncate": Flag(default=False),
    "truncation_direction": Choice(("right", "Right")),  # null: right, TEI's default
    "prompt_name": Choice(INPUT_TYPES),
    **SHARED,
}, synonym=("prompt_name", "input_type"))  # fmt: skip


def request_schema(family: Family, *, max_items: int, default_model: bool) -> dict[str, Any]:
    """The JSON Schema of a family's request body, as the checks below read it, on a server
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
    schema = {"type": "object", "properties": properties,
              "required": ["model", family.texts] if required else [family.texts]}  # fmt: skip
    if family.closed:
        schema["additionalProperties"] = False
    if family.synonym is not None:
        first, second = family.synonym
        choice = family.options[first]
        assert isinstance(choice, Choice), "synonyms are choices"
        schema["allOf"] = [{"if": {"required": [first], "properties": {first: {"const": value}}},
                            "then": {"properties": {second: {"enum": [value, None]}}}}
                           for value in choice.values]  # fmt: skip
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
    base64: bool = False  # OpenAI: encoding_format
    normalize: bool | None = None  # TEI
    truncate: bool = True  # TEI: false makes an over-long text an error


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


def _object(body: bytes) -> dict[str, Any]:
    if not body:
        raise InvalidJSON("the request body is empty: send a JSON object")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidJSON("the request body must be a JSON object")
    return data


def _unknown(data: dict[str, Any], known: set[str]) -> None:
    extra = sorted(set(data) - known)
    if extra:
        names = ", ".join(shown(name) for name in extra[:MAX_NAMED_FIELDS])
        more = f" and {len(extra) - MAX_NAMED_FIELDS} more" if len(extra) > MAX_NAMED_FIELDS else ""
        raise InvalidOption(
            f"unrecognized request argument(s): {names}{more}", param=shown(extra[0])
        )


def _model(data: dict[str, Any], family: Family, default: str | None) -> str:
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


def _texts(value: Any, param: str, max_items: int) -> list[str]:
    if value is None:
        raise EmptyInput(f"`{param}` is required: a string or a list of strings", param=param)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list):
        raise InvalidInput(f"`{param}` must be a string or a list of strings", param=param)
    if not texts:
        raise EmptyInput(f"`{param}` is empty: send at least one text", param=param)
    if len(texts) > max_items:
        raise TooManyItems(
            f"`{param}` has {len(texts)} items; at most {max_items} are allowed per request "
            "(EMBEDX_MAX_REQUEST_ITEMS): split it",
            param=param,
        )
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


def _options(data: dict[str, Any], family: Family) -> dict[str, Any]:
    """Each of the family's options, read, or its default where the request has none (or
    null)."""
    values: dict[str, Any] = {}
    for key, option in family.options.items():
        value = data.get(key)
        values[key] = option.default if value is None else option.read(value, key)
    if family.synonym is not None:
        first, second = family.synonym
        if None not in (values[first], values[second]) and values[first] != values[second]:
            raise InvalidOption(f"`{first}` and `{second}` disagree: send one", param=first)
    return values


def parse_openai(body: bytes, max_items: int) -> EmbedRequest:
    """POST /v1/embeddings, as the OpenAI API defines it, plus embedx's load fields."""
    data = _object(body)
    _unknown(data, OPENAI.fields())
    options = _options(data, OPENAI)
    return _request(
        data,
        OPENAI,
        options,
        max_items,
        model=_model(data, OPENAI, None),
        input_type=options["input_type"],
        base64=options["encoding_format"] == "base64",
    )


def tei_default(settings: Settings) -> str | None:
    """The model of TEI requests that name none: EMBEDX_DEFAULT_MODEL, else the first of
    EMBEDX_PRELOAD."""
    return settings.default_model or next(iter(settings.preload), None)


def parse_tei(body: bytes, max_items: int, default_model: str | None) -> EmbedRequest:
    """POST /embed, as text-embeddings-inference defines it: a request without `model`
    (TEI serves one model, so its clients send none) goes to `default_model`, and
    `prompt_name` picks the model's prompt as `input_type` does. Other fields are ignored, as
    TEI ignores them."""
    data = _object(body)
    options = _options(data, TEI)
    return _request(
        data,
        TEI,
        options,
        max_items,
        model=_model(data, TEI, default_model),
        input_type=options["prompt_name"] or options["input_type"],
        normalize=options["normalize"],
        truncate=options["truncate"],
    )


def _request(
    data: dict[str, Any],
    family: Family,
    options: dict[str, Any],
    max_items: int,
    *,
    model: str,
    input_type: str | None,
    **own: Any,
) -> EmbedRequest:
    """The fields both API families share, then each family's own (the model and the
    prompt each family finds its own way)."""
    return EmbedRequest(
        model=model,
        texts=_texts(data.get(family.texts), family.texts, max_items),
        load=LoadRequest(
            pooling=options["pooling"],
            dtype=options["dtype"],
            max_seq_len=options["max_seq_len"],
            keep_alive_s=options["keep_alive"],
        ),
        dimensions=options["dimensions"],
        input_type=input_type,
        **own,
    )
