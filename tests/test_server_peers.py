"""Peers' clients and tools, unchanged, against a real server: infinity's client (its model
cards and embeddings), and TEI's metric names."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import MINILM_NAME
from tests.support.server import Server, client, metric, post, running_server

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
