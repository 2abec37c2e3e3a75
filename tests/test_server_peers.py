"""Peers' clients and tools, unchanged, against a real server: infinity's client (its model
cards and embeddings)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.conftest import MINILM_NAME
from tests.support.server import Server, client, running_server


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
