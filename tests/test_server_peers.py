"""Peers' clients and tools, unchanged, against a real server: infinity's client (its model
cards and embeddings), TEI's metric names, /tokenize and /decode."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.models import MINILM_NAME
from tests.support.server import Server, assert_envelope, client, metric, post, running_server

DOCS = Path(__file__).parent.parent / "docs" / "metrics.md"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("peers"), preload=MINILM_NAME) as running:
        yield running


def test_infinitys_client_lists_the_models_and_gets_the_models_vectors(
    server: Server, st_reference: Any, reference_texts: list[str]
) -> None:
    from infinity_client import Client
    from infinity_client.api.default import embeddings, models
    from infinity_client.models import OpenAIEmbeddingInputText, OpenAIEmbeddingResult

    infinity = Client(base_url=server.url, raise_on_unexpected_status=True)
    cards = models.sync(client=infinity)
    assert cards is not None
    minilm = next(card for card in cards.data if card.id == MINILM_NAME)
    assert minilm.capabilities == ["embed"]
    assert minilm.stats["queue_absolute"] == 0
    body = OpenAIEmbeddingInputText(input_=reference_texts[:4], model=MINILM_NAME)
    result = embeddings.sync(client=infinity, body=body)
    assert isinstance(result, OpenAIEmbeddingResult)
    vectors = np.array([row.embedding for row in result.data])
    np.testing.assert_allclose(vectors, st_reference[:4], atol=1e-4)


def test_the_openai_sdk_still_lists_and_retrieves_the_models(server: Server) -> None:
    sdk = client(server)
    listed = {model.id: model for model in sdk.models.list()}
    assert listed[MINILM_NAME].owned_by == "embedx"
    assert sdk.models.retrieve(MINILM_NAME).id == MINILM_NAME


def test_tei_metric_names_count_the_requests_texts_tokens_and_batches(
    server: Server, reference_texts: list[str]
) -> None:
    before = httpx.get(server.url + "/metrics").text
    answers = [post(server, "/embed", json={"inputs": reference_texts[0]}),
               post(server, "/embed", json={"inputs": reference_texts[1:4]})]  # fmt: skip
    refused = post(server, "/embed", json={"inputs": "word " * 1000, "truncate": False})
    assert [a.status_code for a in answers] == [200, 200]
    assert refused.status_code == 400
    after = httpx.get(server.url + "/metrics").text

    def grew(name: str, **labels: str) -> float:
        return (metric(after, name, **labels) or 0) - (metric(before, name, **labels) or 0)

    counted = {method: (grew("te_request_count", method=method),
                        grew("te_request_success", method=method))
               for method in ("single", "batch")}  # fmt: skip
    assert counted == {"single": (2, 1), "batch": (1, 1)}  # the refused one is a single
    assert grew("te_request_failure", err="validation") == 1
    for timed in ("duration", "tokenization_duration", "queue_duration", "inference_duration"):
        assert grew(f"te_request_{timed}_count") >= 2 - (timed == "queue_duration")
    tokens = sum(int(a.headers["x-total-tokens"]) for a in answers)
    assert grew("te_request_input_length_count") == 4
    assert grew("te_request_input_length_sum") == tokens
    assert grew("te_batch_next_size_sum") == 4
    assert grew("te_batch_next_tokens_sum") == tokens
    assert metric(after, "te_queue_size") == 0
    assert grew("embedx_batch_items_sum", model=MINILM_NAME, device="cpu") == 4


def test_every_tei_alias_served_is_documented_and_every_documented_one_served(
    server: Server,
) -> None:
    served = {family.name for family in text_string_to_metric_families(
        httpx.get(server.url + "/metrics").text) if family.name.startswith("te_")}  # fmt: skip
    documented = set(re.findall(r"^\| `(te_\w+)` \|", DOCS.read_text(), re.MULTILINE))
    assert served == documented


def test_tokenize_shows_the_models_tokens_as_tei_does_with_byte_offsets_and_none_cut(
    server: Server, minilm_dir: Path, reference_texts: list[str]
) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(minilm_dir))
    texts = ["Ünïcödé café, naïve: 東京 costs 5€!", " ".join(reference_texts[:40])]
    for special in (True, False):
        answer = post(server, "/tokenize", json={"inputs": texts, "add_special_tokens": special})
        assert answer.status_code == 200, answer.text
        for text, tokens in zip(texts, answer.json(), strict=True):
            expected = reference(text, add_special_tokens=special, return_offsets_mapping=True,
                                 return_special_tokens_mask=True)  # fmt: skip
            assert [t["id"] for t in tokens] == expected["input_ids"]  # all of them: none cut
            for token, id_, (start, stop), is_special in zip(
                tokens, expected["input_ids"], expected["offset_mapping"],
                expected["special_tokens_mask"], strict=True):  # fmt: skip
                if is_special:
                    assert token == {"id": id_, "text": reference.convert_ids_to_tokens(id_),
                                     "special": True, "start": None, "stop": None}  # fmt: skip
                else:
                    utf8 = len(text[:start].encode()), len(text[:stop].encode())
                    assert token == {"id": id_, "text": text[start:stop], "special": False,
                                     "start": utf8[0], "stop": utf8[1]}  # fmt: skip
    assert len(answer.json()[1]) > 512  # past the model's length: TEI cuts nothing here
    single = post(server, "/tokenize", json={"inputs": texts[0]}).json()
    assert single == post(server, "/tokenize", json={"inputs": texts[:1]}).json()


def test_decode_writes_ids_back_as_the_models_tokenizer_does(
    server: Server, minilm_dir: Path
) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(minilm_dir))
    rows = [reference("Ünïcödé café, naïve!")["input_ids"], reference("a second text")["input_ids"]]
    for skip in (True, False):
        answer = post(server, "/decode", json={"ids": rows, "skip_special_tokens": skip})
        assert answer.json() == [reference.decode(row, skip_special_tokens=skip) for row in rows]
    assert post(server, "/decode", json={"ids": rows[0]}).json() == [
        reference.decode(rows[0], skip_special_tokens=True)
    ]
    past = post(server, "/decode", json={"ids": [reference.vocab_size + 5]})
    assert_envelope(past, 400, "invalid_input")
    assert "vocabulary" in past.json()["error"]["message"]


def test_docs_is_swagger_ui_from_files_this_server_serves(server: Server) -> None:
    page = httpx.get(server.url + "/docs")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    urls = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page.text.split("<noscript>")[0])
    urls += re.findall(r"url: '([^']+)'", page.text)
    assert "openapi.json" in urls
    assert "docs/swagger-ui-bundle.js" in urls
    for url in urls:  # relative, as a proxy's path prefix needs, and on this server
        assert "//" not in url, url
        answer = httpx.get(f"{server.url}/{url}")
        assert answer.status_code == 200, url
    assert "validatorUrl: null" in page.text  # no call to the public validator
    bundle = httpx.get(server.url + "/docs/swagger-ui-bundle.js")
    assert bundle.headers["content-type"].startswith("text/javascript")
    assert b"SwaggerUIBundle" in bundle.content
    assert "text/css" in httpx.get(server.url + "/docs/swagger-ui.css").headers["content-type"]
    assert httpx.get(server.url + "/docs/..%2F..%2Fpyproject.toml").status_code == 404
    assert_envelope(httpx.get(server.url + "/docs/index.html"), 404, "not_found")
