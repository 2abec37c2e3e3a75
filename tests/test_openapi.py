"""The OpenAPI document against the server that serves it: every request the document allows
is taken, every one it forbids refused, and every answer is one it describes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema_rs
import pytest

from embedx.config import load_settings
from embedx.devices import CpuAccelerator
from embedx.errors import EmbedxError
from embedx.models.catalog import load_catalog
from embedx.registry import ModelRegistry
from embedx.server.app import create_app
from embedx.server.openapi import openapi_spec
from tests.conftest import cpu_info

KEY = "test-key"


def app_with(**settings: object) -> Any:
    """The real app on one fake CPU device; nothing loads until a request asks."""
    config = load_settings({"max_request_items": 8, **settings}, environ={})
    registry = ModelRegistry(config, load_catalog(None), [cpu_info()], CpuAccelerator)
    return create_app(config, registry)


@pytest.fixture
async def unkeyed() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app_with())
    async with httpx.AsyncClient(transport=transport, base_url="http://embedx") as client:
        yield client


def request_schema(spec: dict[str, Any], path: str) -> dict[str, Any]:
    body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    return dict(body["schema"])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": "", "input": "x"}),
        ("/v1/embeddings", {"model": " ", "input": "x"}),  # a name, found nowhere: a 404
        ("/v1/embeddings", {"model": "m", "input": "x", "keep_alive": ""}),
        ("/v1/embeddings", {"model": "m", "input": "x", "keep_alive": "10m\n"}),
        ("/v1/embeddings", {"model": "m", "input": "x", "keep_alive": "9" * 400}),
        ("/v1/embeddings", {"model": "m", "input": "x", "keep_alive": None}),
        ("/v1/embeddings", {"model": "m", "input": "x", "user": None}),
        ("/v1/embeddings", {"model": "m", "input": "x", "dimensions": None}),
        ("/v1/embeddings", {"model": "m", "input": "x", "dimensions": 64.0}),
        ("/v1/embeddings", {"model": "m", "input": "x", "max_seq_len": 1}),
        ("/v1/embeddings", {"model": "m", "input": "x", "pooling": "max"}),
        ("/v1/embeddings", {"model": "m", "input": "x", "dtype": "int3"}),
        ("/v1/embeddings", {"model": "m", "input": ["x"] * 9}),
        ("/v1/embeddings", {"model": "m" * 1025, "input": "x"}),
        ("/v1/embeddings", {"model": "m\u0085", "input": "x"}),
        ("/embed", {"inputs": "x"}),  # no default model on this server: it must name one
        ("/embed", {"model": "", "inputs": "x"}),
        ("/embed", {"model": "m", "inputs": "x", "truncation_direction": None}),
        ("/embed", {"model": "m", "inputs": "x", "options": {}}),  # ignored, as TEI does
    ],
)
@pytest.mark.anyio
async def test_the_document_allows_exactly_the_requests_the_server_takes(
    unkeyed: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    """Taken: past the checks, to the model's lookup (none of these names is found, a 404).
    Refused: a 400."""
    spec = (await unkeyed.get("/openapi.json")).json()
    documented = jsonschema_rs.Draft202012Validator(request_schema(spec, path)).is_valid(body)
    response = await unkeyed.post(path, json=body)
    assert response.status_code in (400, 404), response.text
    assert documented == (response.status_code == 404), response.text


@pytest.mark.anyio
async def test_bearer_auth_and_its_401s_are_documented_only_where_a_key_is_set(
    unkeyed: httpx.AsyncClient,
) -> None:
    spec = (await unkeyed.get("/openapi.json")).json()
    assert "security" not in spec
    assert "securitySchemes" not in spec.get("components", {})
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            assert "401" not in operation["responses"], (method, path)
    transport = httpx.ASGITransport(app=app_with(api_key=KEY))
    async with httpx.AsyncClient(transport=transport, base_url="http://embedx") as keyed:
        spec = (await keyed.get("/openapi.json", headers={"authorization": f"Bearer {KEY}"})).json()
        assert spec["security"] == [{"bearer": []}]
        assert spec["paths"]["/health"]["get"]["security"] == []
        for path, methods in spec["paths"].items():
            for method, operation in methods.items():
                documented = "401" in operation["responses"]
                assert documented is (path != "/health"), (method, path)
                if method == "get":
                    answered = (await keyed.get(path.replace("{model}", "m"))).status_code
                    assert (answered == 401) is documented, (method, path)


def test_every_status_an_error_carries_is_documented() -> None:
    statuses: set[int] = set()
    classes: list[type[EmbedxError]] = [EmbedxError]
    while classes:
        error = classes.pop()
        statuses.add(error.status)
        classes.extend(error.__subclasses__())
    spec = openapi_spec(keyed=True, max_items=8, default_model=False)
    operations = [op for methods in spec["paths"].values() for op in methods.values()]
    documented = {int(status) for operation in operations for status in operation["responses"]}
    assert statuses <= documented
