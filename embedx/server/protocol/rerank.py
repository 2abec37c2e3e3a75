"""The scoring APIs on the wire: reranking as TEI, Cohere (v1, v2), Jina and infinity shape it,
and classifying as TEI's /predict and infinity's /classify do; each request's fields as a
table the parser and the JSON Schema both read, and each answer's shape."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from embedx.errors import EmptyInput, InvalidInput, InvalidOption
from embedx.models.prompts import MAX_INSTRUCTION
from embedx.registry import LoadRequest
from embedx.server.protocol.family import (
    CONTROL,
    MAX_MODEL_NAME,
    checked_model_name,
    json_object,
    within_items,
)
from embedx.server.protocol.fields import Choice, Flag, Integer, Option, Text
from embedx.server.protocol.schema import Described, operation

Style = Literal["tei", "cohere", "infinity"]
# What infinity's clients send for a model they do not name: the server's default then.
INFINITY_DEFAULT = "default/not-specified"


@dataclass(frozen=True, slots=True)
class ScoreRequest:
    """A scoring request, whatever its family: a query and its documents, or texts (and
    pairs) to classify."""

    model: str | None  # None: the server's default scorer
    inputs: list[str | tuple[str, str]]
    documents: list[str]  # a rerank's, in order (what return_documents sends back)
    top_n: int | None = None
    return_documents: bool = False
    raw_scores: bool = False
    truncate: bool = True
    single: bool = False  # /predict given one input, not a list: one answer, not a list
    instruction: str | None = None  # a causal-LM reranker's system prompt; None: its default

    @property
    def load(self) -> LoadRequest:
        return LoadRequest(task="score")


# Each family's fields beside its model and its texts: ignored if unknown, as TEI, Cohere's
# SDKs (which send fields of other versions) and infinity's pydantic models do.
RERANK: dict[str, Option] = {
    "top_n": Integer(1),
    "return_documents": Flag(default=False),
    "raw_scores": Flag(default=False),  # infinity's: the logits
    "truncate": Flag(default=True),
    "instruction": Text(longest=MAX_INSTRUCTION),  # a causal-LM reranker's (Qwen3-Reranker's)
}
TEI_RERANK: dict[str, Option] = {
    "raw_scores": Flag(default=False),
    "return_text": Flag(default=False),
    "truncate": Flag(default=False),  # as TEI: an over-long pair is a 400 unless true
    "truncation_direction": Choice(("right", "Right")),
    "instruction": Text(longest=MAX_INSTRUCTION),
}
PREDICT: dict[str, Option] = {
    "raw_scores": Flag(default=False),
    "truncate": Flag(default=False),
    "truncation_direction": Choice(("right", "Right")),
}
CLASSIFY: dict[str, Option] = {"raw_scores": Flag(default=False)}


def parse_rerank(body: bytes, max_items: int) -> tuple[ScoreRequest, Style]:
    """POST /rerank: TEI's shape (`texts`; its clients name no model) or Cohere's, Jina's and
    infinity's (`documents`)."""
    data = json_object(body)
    if "texts" in data and "documents" not in data:
        return _tei_rerank(data, max_items), "tei"
    return parse_cohere(data, max_items), "infinity"


def parse_cohere(data: dict[str, Any] | bytes, max_items: int) -> ScoreRequest:
    """Cohere's /v1/rerank and /v2/rerank (and Jina's, and infinity's /rerank):
    `{model, query, documents: [str | {text}], top_n, return_documents}`."""
    data = json_object(data) if isinstance(data, bytes) else data
    options = _options(data, RERANK)
    query = _query(data)
    documents = [_document(item, i) for i, item in enumerate(_items(data, "documents", max_items))]
    return ScoreRequest(
        model=_model(data),
        inputs=[(query, document) for document in documents],
        documents=documents,
        top_n=options["top_n"],
        return_documents=options["return_documents"],
        raw_scores=options["raw_scores"],
        truncate=options["truncate"],
        instruction=options["instruction"],
    )


def _tei_rerank(data: dict[str, Any], max_items: int) -> ScoreRequest:
    options = _options(data, TEI_RERANK)
    query = _query(data)
    texts = _texts(_items(data, "texts", max_items), "texts")
    return ScoreRequest(
        model=_model(data),
        inputs=[(query, text) for text in texts],
        documents=texts,
        return_documents=options["return_text"],
        raw_scores=options["raw_scores"],
        truncate=options["truncate"],
        instruction=options["instruction"],
    )


def parse_predict(body: bytes, max_items: int) -> ScoreRequest:
    """TEI's /predict: `inputs` is a text, a [text, text] pair, or a list of either."""
    data = json_object(body)
    options = _options(data, PREDICT)
    given = data.get("inputs")
    single = isinstance(given, str) or _is_pair(given)
    items = [given] if single else _items(data, "inputs", max_items)
    inputs: list[str | tuple[str, str]] = []
    for i, item in enumerate(items):
        if isinstance(item, str) and item:
            inputs.append(item)
        elif _is_pair(item):
            inputs.append((item[0], item[1]))
        else:
            raise InvalidInput(
                f"`inputs[{i}]` is neither a text nor a [text, text] pair", param="inputs"
            )
    return ScoreRequest(
        model=_model(data),
        inputs=inputs,
        documents=[],
        raw_scores=options["raw_scores"],
        truncate=options["truncate"],
        single=single,
    )


def parse_classify(body: bytes, max_items: int) -> ScoreRequest:
    """infinity's /classify: `{model, input: [text], raw_scores}`."""
    data = json_object(body)
    options = _options(data, CLASSIFY)
    texts = _texts(_items(data, "input", max_items, single_ok=True), "input")
    return ScoreRequest(
        model=_model(data), inputs=list(texts), documents=[], raw_scores=options["raw_scores"]
    )


def _options(data: dict[str, Any], table: dict[str, Option]) -> dict[str, Any]:
    return {
        key: option.default if data.get(key) is None else option.read(data[key], key)
        for key, option in table.items()
    }


def _model(data: dict[str, Any]) -> str | None:
    """The model a request names, or None for the server's default scorer."""
    model = data.get("model")
    if model in (None, "", INFINITY_DEFAULT):
        return None
    if not isinstance(model, str):
        raise InvalidOption("`model` must be a string", param="model")
    return checked_model_name(model)


def _query(data: dict[str, Any]) -> str:
    query = data.get("query")
    if query is None:
        raise EmptyInput(
            "`query` is required: the text to rank the documents against", param="query"
        )
    if not isinstance(query, str):
        raise InvalidInput("`query` must be a string", param="query")
    if not query:
        raise EmptyInput("`query` is empty: send the text to rank against", param="query")
    return query


def _items(data: dict[str, Any], key: str, max_items: int, single_ok: bool = False) -> list[Any]:
    value = data.get(key)
    if single_ok and isinstance(value, str):
        value = [value]
    if value is None:
        raise EmptyInput(f"`{key}` is required: a list", param=key)
    if not isinstance(value, list):
        raise InvalidInput(f"`{key}` must be a list", param=key)
    if not value:
        raise EmptyInput(f"`{key}` is empty: send at least one", param=key)
    within_items(value, key, max_items)
    return value


def _texts(items: list[Any], key: str) -> list[str]:
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise InvalidInput(f"`{key}[{i}]` must be a non-empty string", param=key)
    return items


def _document(item: Any, index: int) -> str:
    """A document as Cohere takes one: a string, or an object whose `text` is one."""
    text = item.get("text") if isinstance(item, dict) else item
    if not isinstance(text, str) or not text:
        raise InvalidInput(
            f"`documents[{index}]` must be a non-empty string or an object with a `text` string",
            param="documents",
        )
    return text


def _is_pair(item: Any) -> bool:
    return (
        isinstance(item, list)
        and len(item) == 2
        and all(isinstance(side, str) and side for side in item)
    )


def ranked(scores: np.ndarray, top_n: int | None) -> list[int]:
    """The documents' indices, best first (ties in their order), the first `top_n` only."""
    return [int(i) for i in np.argsort(-scores[:, 0], kind="stable")[:top_n]]


def tei_rerank_answer(request: ScoreRequest, scores: np.ndarray) -> list[dict[str, Any]]:
    return [
        {"index": i, "score": float(scores[i, 0]),
         **({"text": request.documents[i]} if request.return_documents else {})}
        for i in ranked(scores, request.top_n)
    ]  # fmt: skip


def cohere_answer(
    request: ScoreRequest, scores: np.ndarray, model: str, tokens: int, style: Style, version: str
) -> dict[str, Any]:
    """Cohere's shape (a document is `{text}`), or infinity's (a document is its text)."""
    results = []
    for i in ranked(scores, request.top_n):
        result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i, 0])}
        if request.return_documents:
            text = request.documents[i]
            result["document"] = text if style == "infinity" else {"text": text}
        results.append(result)
    answer = _envelope("rerank", model, tokens)
    answer["results"] = results
    if style == "cohere":
        answer["meta"] = {"api_version": {"version": version},
                          "billed_units": {"search_units": 1}}  # fmt: skip
    return answer


def labelled(row: np.ndarray, labels: Sequence[str]) -> list[dict[str, Any]]:
    """One input's scores as `[{label, score}]`, best first, as TEI and infinity give them."""
    order = np.argsort(-row, kind="stable")
    return [{"label": labels[i], "score": float(row[i])} for i in order]


def predict_answer(request: ScoreRequest, scores: np.ndarray, labels: Sequence[str]) -> Any:
    rows = [labelled(row, labels) for row in scores]
    return rows[0] if request.single else rows


def classify_answer(
    scores: np.ndarray, labels: Sequence[str], model: str, tokens: int
) -> dict[str, Any]:
    answer = _envelope("classify", model, tokens)
    answer["data"] = [labelled(row, labels) for row in scores]
    return answer


def _envelope(kind: str, model: str, tokens: int) -> dict[str, Any]:
    return {"object": kind, "id": uuid.uuid4().hex, "created": int(time.time()), "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}  # fmt: skip


MODEL_FIELD = {"type": ["string", "null"], "maxLength": MAX_MODEL_NAME,
               "pattern": f"^[^{CONTROL}]*$",
               "description": "A reranker or classifier; unset: EMBEDX_DEFAULT_MODEL where it "
                              "scores, else the first scorer of EMBEDX_PRELOAD."}  # fmt: skip


def _request(fields: dict[str, Any], table: dict[str, Option], required: list[str]) -> Any:
    """A request body's JSON Schema: its own fields, then the table's options (null: unset)."""
    properties = {"model": MODEL_FIELD, **fields}
    for key, option in table.items():
        schema = option.schema()
        properties[key] = {**schema, "type": [schema["type"], "null"]}
        if "enum" in schema:
            properties[key]["enum"] = [*schema["enum"], None]
        if option.default is not None:
            properties[key]["default"] = option.default
    return {"type": "object", "properties": properties, "required": required,
            "description": "Fields other than these are ignored."}  # fmt: skip


def _texts_schema(max_items: int) -> dict[str, Any]:
    text = {"type": "string", "minLength": 1}
    return {"type": "array", "items": text, "minItems": 1, "maxItems": max_items}


def _schemas(max_items: int) -> dict[str, Any]:
    query = {"type": "string", "minLength": 1}
    text = {"type": "string", "minLength": 1}
    document = {"oneOf": [text, {"type": "object", "required": ["text"],
                                 "properties": {"text": text}}]}  # fmt: skip
    documents = {"type": "array", "items": document, "minItems": 1, "maxItems": max_items}
    pair = {"type": "array", "items": text, "minItems": 2, "maxItems": 2}
    one = {"oneOf": [text, pair]}
    inputs = {"oneOf": [one, {"type": "array", "items": one, "minItems": 1,
                              "maxItems": max_items}]}  # fmt: skip
    return {
        "cohere": _request({"query": query, "documents": documents}, RERANK,
                           ["query", "documents"]),
        "tei": _request({"query": query, "texts": _texts_schema(max_items)}, TEI_RERANK,
                        ["query", "texts"]),
        "predict": _request({"inputs": inputs}, PREDICT, ["inputs"]),
        "classify": _request({"input": {"oneOf": [text, _texts_schema(max_items)]}}, CLASSIFY,
                             ["input"]),
    }  # fmt: skip


USAGE = {"type": "object", "required": ["prompt_tokens", "total_tokens"],
         "properties": {"prompt_tokens": {"type": "integer"},
                        "total_tokens": {"type": "integer"}}}  # fmt: skip
ENVELOPE = {"id": {"type": "string"}, "created": {"type": "integer"}, "model": {"type": "string"},
            "usage": USAGE}  # fmt: skip
LABELLED = {"type": "array", "items": {"type": "object", "required": ["label", "score"],
            "properties": {"label": {"type": "string"}, "score": {"type": "number"}}}}  # fmt: skip
TEI_RANKED = {"type": "array", "items": {"type": "object", "required": ["index", "score"],
              "properties": {"index": {"type": "integer"}, "score": {"type": "number"},
                             "text": {"type": "string"}}}}  # fmt: skip


def _results(document: Any) -> dict[str, Any]:
    result = {"type": "object", "required": ["index", "relevance_score"],
              "properties": {"index": {"type": "integer"}, "relevance_score": {"type": "number"},
                             "document": document}}  # fmt: skip
    return {"type": "object", "required": ["object", "results", "model", "usage"],
            "properties": {"object": {"const": "rerank"}, **ENVELOPE, "meta": {"type": "object"},
                           "results": {"type": "array", "items": result}}}  # fmt: skip


COHERE_RANKED = _results({"type": "object", "properties": {"text": {"type": "string"}}})
INFINITY_RANKED = _results({"type": "string"})
CLASSIFIED = {"type": "object", "required": ["object", "data", "model", "usage"],
              "properties": {"object": {"const": "classify"}, **ENVELOPE,
                             "data": {"type": "array", "items": LABELLED}}}  # fmt: skip
EXAMPLES = {
    "cohere": {"query": "What is the capital of France?",
               "documents": ["Paris is the capital of France.", "Berlin is in Germany."],
               "top_n": 1},
    "tei": {"query": "What is the capital of France?",
            "texts": ["Paris is the capital of France.", "Berlin is in Germany."]},
    "predict": {"inputs": ["I like you.", "I dislike you."]},
    "classify": {"input": ["I like you.", "I dislike you."]},
}  # fmt: skip

SCORING = (400, 404, 415)  # a body read and checked, a model found and leased


def operations(server: Described) -> dict[str, dict[str, Any]]:
    """The family's paths as the OpenAPI document describes them."""
    schemas = _schemas(server.max_items)

    def post(summary: str, ok: Any, shape: str) -> dict[str, Any]:
        body = {"schema": schemas[shape], "example": EXAMPLES[shape]}
        return {"post": operation(summary, ok, keyed=server.keyed, errors=SCORING,
                                  request=body)}  # fmt: skip

    either = {"oneOf": [schemas["tei"], schemas["cohere"]]}
    rerank = post("Rerank: TEI's shape (`texts`: a list of {index, score, text}, best first), "
                  "or Cohere's and infinity's (`documents`: infinity's answer)",
                  {"oneOf": [TEI_RANKED, INFINITY_RANKED]}, "tei")  # fmt: skip
    rerank["post"]["requestBody"]["content"]["application/json"]["schema"] = either
    return {
        "/rerank": rerank,
        "/v1/rerank": post("Rerank (Cohere v1, Jina)", COHERE_RANKED, "cohere"),
        "/v2/rerank": post("Rerank (Cohere v2)", COHERE_RANKED, "cohere"),
        "/predict": post("Classify texts or pairs (TEI): [{label, score}], best first; a "
                         "list of them for a list of inputs",
                         {"oneOf": [LABELLED, {"type": "array", "items": LABELLED}]},
                         "predict"),
        "/classify": post("Classify texts (infinity)", CLASSIFIED, "classify"),
        "/v1/classify": post("As /classify", CLASSIFIED, "classify"),
    }  # fmt: skip
