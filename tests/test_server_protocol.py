"""Each family's wire format alone: its parser's reading of bodies, its request table against
the document's schema, and the base64 response laid out before its rows."""

from __future__ import annotations

import base64
import json

import numpy as np
import orjson
import pytest

from embedx.errors import InvalidOption, TokenInputNotSupported
from embedx.server.openapi import openapi_spec
from embedx.server.protocol.openai import OPENAI, Base64Items, parse_openai
from embedx.server.protocol.tei import TEI, parse_tei


def test_keep_alive_is_read_in_seconds_minutes_and_hours() -> None:
    for given, seconds in ((90, 90.0), ("90", 90.0), ("10m", 600.0), ("1.5h", 5400.0), ("0", 0.0)):
        body = orjson.dumps({"model": "m", "input": "x", "keep_alive": given})
        assert parse_openai(body, 10).load.keep_alive_s == seconds, given


def test_token_ids_on_tei_are_refused_without_the_openai_clients_hint() -> None:
    with pytest.raises(TokenInputNotSupported) as tei:
        parse_tei(b'{"inputs": [[101, 2023, 102]]}', 10, "m")
    assert "LangChain" not in tei.value.message  # TEI's ids are the model's own vocabulary's
    with pytest.raises(TokenInputNotSupported, match="check_embedding_ctx_length=False"):
        parse_openai(b'{"model": "m", "input": [[101, 2023, 102]]}', 10)


def test_a_tei_request_naming_no_model_on_a_server_with_no_default_says_how_to_set_one() -> None:
    for body in (b'{"inputs": "x"}', b'{"inputs": "x", "model": ""}'):
        with pytest.raises(InvalidOption, match="EMBEDX_DEFAULT_MODEL") as caught:
            parse_tei(body, 10, None)
        assert caught.value.param == "model"
        assert parse_tei(body, 10, "m").model == "m"
    with pytest.raises(InvalidOption, match=r"is required: the name of the model to embed with$"):
        parse_openai(b'{"input": "x"}', 10)  # OpenAI's clients always send one: no hint


def test_the_openapi_request_schemas_name_exactly_the_fields_the_server_accepts() -> None:
    paths = openapi_spec(keyed=False, max_items=8, default_model=True)["paths"]
    for path, family in (("/v1/embeddings", OPENAI), ("/embed", TEI), ("/", TEI)):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert set(schema["properties"]) == family.fields(), path
        assert set(family.notes) <= family.fields(), path


@pytest.mark.parametrize("count", [1, 10, 11, 100, 1234])  # indices of 1 to 4 digits
def test_base64_items_frame_every_row_as_json(count: int) -> None:
    from embedx.engine.base64_rows import encode_on_host

    rows = np.random.default_rng(0).standard_normal((count, 8)).astype(np.float32)
    items = Base64Items()
    items(count, 44)[:] = encode_on_host(rows)  # 8 float32: 32 bytes, 44 characters
    response = json.loads(items.body(b'"model":"m"}'))
    assert response["model"] == "m"
    assert response["object"] == "list"
    assert [item["index"] for item in response["data"]] == list(range(count))
    assert {item["object"] for item in response["data"]} == {"embedding"}
    got = [np.frombuffer(base64.b64decode(item["embedding"]), "<f4") for item in response["data"]]
    assert np.array_equal(np.stack(got), rows)
