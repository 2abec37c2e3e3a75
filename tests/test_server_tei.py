"""TEI's route in this process: bare vectors and timing headers, the server's model for
requests that name none, and TEI's own fields (TEI's client itself: test_server_http.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from embedx import Embedder
from tests.support.models import MINILM_NAME
from tests.support.server import InProcess, assert_envelope, in_process

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide: the app below serves every test of the module


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[InProcess]:
    async with in_process({"preload": MINILM_NAME}) as app:
        yield app


@pytest.fixture(scope="module")
def embedder() -> Iterator[Embedder]:
    with Embedder(MINILM_NAME) as library:
        yield library


async def test_tei_embed_returns_bare_vectors(
    served: InProcess, embedder: Embedder, reference_texts: list[str]
) -> None:
    body = {"model": MINILM_NAME, "inputs": reference_texts[:3]}
    response = await served.client.post("/embed", json=body)
    assert response.status_code == 200
    assert int(response.headers["x-total-time"]) >= int(response.headers["x-inference-time"])
    assert int(response.headers["x-total-tokens"]) > 3
    expected = embedder.embed(reference_texts[:3])
    assert np.array_equal(np.array(response.json(), dtype=np.float32), expected)
    single = (await served.client.post("/", json={"model": MINILM_NAME, "inputs": "one"})).json()
    assert len(single) == 1
    assert len(single[0]) == 384


async def test_tei_clients_that_name_no_model_get_the_preloaded_one(
    served: InProcess, embedder: Embedder, reference_texts: list[str]
) -> None:
    """TEI serves one model, so its clients send no `model`; with every TEI field, as a
    client that sends each unset field as null would."""
    client = served.client
    body = {"inputs": reference_texts[:3], "normalize": None, "truncate": None,
            "truncation_direction": None, "prompt_name": None, "dimensions": None}  # fmt: skip
    response = await client.post("/embed", json=body)
    assert response.status_code == 200, response.text
    expected = embedder.embed(reference_texts[:3])
    assert np.array_equal(np.array(response.json(), dtype=np.float32), expected)
    alone = embedder.embed(reference_texts[:1])[0]
    ignored: dict[str, Any]
    for ignored in ({"model": ""}, {"options": {"wait_for_model": True}}, {"parameters": {}}):
        # a blank model, and the Inference API's fields older clients send, as TEI takes them
        response = await client.post("/embed", json={"inputs": reference_texts[0], **ignored})
        assert response.status_code == 200, response.text
        assert np.array_equal(np.array(response.json()[0], np.float32), alone)
    response = await client.post("/embed", json={"inputs": "x", "prompt_name": "q"})
    assert assert_envelope(response, 400, "invalid_option")["param"] == "prompt_name"
    response = await client.post("/embed", json={"inputs": "x", "prompt_name": "query"})
    assert "no prompt" in assert_envelope(response, 400, "invalid_input")["message"]


async def test_tei_truncation_direction_right_or_null_is_accepted_and_left_refused(
    served: InProcess,
) -> None:
    body: dict[str, Any] = {"model": MINILM_NAME, "inputs": "x"}
    for direction in (None, "right", "Right"):
        response = await served.client.post(
            "/embed", json={**body, "truncation_direction": direction}
        )
        assert response.status_code == 200, response.text
    response = await served.client.post("/embed", json={**body, "truncation_direction": "left"})
    assert assert_envelope(response, 400, "invalid_option")["param"] == "truncation_direction"


async def test_tei_truncate_false_refuses_an_over_long_text(served: InProcess) -> None:
    body: dict[str, Any] = {"model": MINILM_NAME, "inputs": "word " * 400}  # false unless sent
    for truncate in (None, False):
        if truncate is not None:
            body["truncate"] = truncate
        response = await served.client.post("/embed", json=body)
        error = assert_envelope(response, 400, "context_length_exceeded")
        assert error["param"] == "inputs"  # TEI's field
    body["truncate"] = True
    assert (await served.client.post("/embed", json=body)).status_code == 200
