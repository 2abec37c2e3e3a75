"""Checking request bodies at the edge, one function per API family: everything past here
receives typed, validated values."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import orjson

from embedx.engine import plain_texts
from embedx.errors import (
    EmptyInput,
    InvalidInput,
    InvalidJSON,
    InvalidOption,
    TokenInputNotSupported,
    TooManyItems,
    UnsupportedMediaType,
)
from embedx.models.catalog import INPUT_TYPES
from embedx.registry import LoadRequest
from embedx.untrusted import shown

OPENAI_FIELDS = {"model", "input", "encoding_format", "dimensions", "user", "input_type",
                 "pooling", "dtype", "max_seq_len", "keep_alive"}  # fmt: skip
# What /embed reads; it ignores the rest, as TEI does (`parse_tei`).
TEI_FIELDS = {"model", "inputs", "normalize", "truncate", "dimensions", "input_type",
              "truncation_direction", "prompt_name", "pooling", "dtype", "max_seq_len",
              "keep_alive"}  # fmt: skip
MAX_NAMED_FIELDS = 5  # of the unknown fields a message lists
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")


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


def _model(data: dict[str, Any], default: str | None, *, defaultable: bool) -> str:
    """The request's model, or (where the route has one, `defaultable`) the server's
    default for requests that name none."""
    model = data.get("model")
    if model in (None, "") and default is not None:  # TEI's clients may send it blank
        return default
    if model is not None and not isinstance(model, str):
        raise InvalidOption(f"`model` must be a string, not {_json_type(model)}", param="model")
    if model is None or not model.strip():
        hint = (
            " (or start the server with EMBEDX_DEFAULT_MODEL, or a model in EMBEDX_PRELOAD, "
            "for requests that name none)"
            if defaultable
            else ""
        )
        raise InvalidOption(
            f"`model` is required: the name of the model to embed with{hint}", param="model"
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


def _positive_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOption(f"`{key}` must be a positive integer", param=key)
    return value


def _bool(data: dict[str, Any], key: str) -> bool | None:
    value = data.get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidOption(f"`{key}` must be true or false", param=key)
    return value


def _choice(data: dict[str, Any], key: str, choices: tuple[str, ...]) -> str | None:
    value = data.get(key)
    if value is not None and value not in choices:
        raise InvalidOption(f"`{key}` must be one of {', '.join(choices)}", param=key)
    return value


def _keep_alive(value: Any) -> float | None:
    """Seconds, as a number or a string like "90s", "10m", "1h"."""
    if value is None:
        return None
    seconds = None
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        seconds = float(value)
    elif match := DURATION.match(value) if isinstance(value, str) else None:
        seconds = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    if seconds is None or not math.isfinite(seconds):  # "1e400" seconds: not a duration
        raise InvalidOption("`keep_alive` must be seconds, or a duration like 90s, 10m, 1h",
                            param="keep_alive")  # fmt: skip
    return seconds


def _load(data: dict[str, Any]) -> LoadRequest:
    pooling = data.get("pooling")
    dtype = data.get("dtype")
    for key, value in (("pooling", pooling), ("dtype", dtype)):
        if value is not None and not isinstance(value, str):
            raise InvalidOption(f"`{key}` must be a string", param=key)
    return LoadRequest(
        pooling=pooling,
        dtype=dtype,
        max_seq_len=_positive_int(data, "max_seq_len"),
        keep_alive_s=_keep_alive(data.get("keep_alive")),
    )


def parse_openai(body: bytes, max_items: int) -> EmbedRequest:
    """POST /v1/embeddings, as the OpenAI API defines it, plus embedx's load fields."""
    data = _object(body)
    _unknown(data, OPENAI_FIELDS)
    encoding = _choice(data, "encoding_format", ("float", "base64")) or "float"
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidOption("`user` must be a string", param="user")
    return _request(
        data,
        "input",
        max_items,
        model=_model(data, None, defaultable=False),
        input_type=_choice(data, "input_type", INPUT_TYPES),
        base64=encoding == "base64",
    )


def parse_tei(body: bytes, max_items: int, default_model: str | None) -> EmbedRequest:
    """POST /embed, as text-embeddings-inference defines it: a request without `model`
    (TEI serves one model, so its clients send none) goes to `default_model`, and
    `prompt_name` picks the model's prompt as `input_type` does. Other fields are ignored, as
    TEI ignores them: the Inference API's `options` and `parameters`, which older clients
    send."""
    data = _object(body)
    if data.get("truncation_direction") not in (None, "right", "Right"):  # null: TEI's default
        raise InvalidOption("only right truncation is supported", param="truncation_direction")
    prompt = _choice(data, "prompt_name", INPUT_TYPES)
    input_type = _choice(data, "input_type", INPUT_TYPES)
    if prompt is not None and input_type is not None and prompt != input_type:
        raise InvalidOption(
            "`prompt_name` and `input_type` name different prompts: send one", param="prompt_name"
        )
    return _request(
        data,
        "inputs",
        max_items,
        model=_model(data, default_model, defaultable=True),
        input_type=prompt or input_type,
        normalize=_bool(data, "normalize"),
        truncate=bool(_bool(data, "truncate")),
    )


def _request(
    data: dict[str, Any],
    texts: str,
    max_items: int,
    *,
    model: str,
    input_type: str | None,
    **family: Any,
) -> EmbedRequest:
    """The fields both API families share, then each family's own (the model and the
    prompt each family finds its own way)."""
    return EmbedRequest(
        model=model,
        texts=_texts(data.get(texts), texts, max_items),
        load=_load(data),
        dimensions=_positive_int(data, "dimensions"),
        input_type=input_type,
        **family,
    )
