"""The OpenAPI document against the server that serves it: every request the document allows
is taken, every one it forbids refused, and every answer is one it describes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import jsonschema_rs
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events, from_schema

from embedx.config import load_settings
from embedx.devices import CpuAccelerator
from embedx.errors import EmbedxError, InvalidRequest
from embedx.models.catalog import load_catalog
from embedx.registry import ModelRegistry
from embedx.server.app import create_app
from embedx.server.openapi import openapi_spec
from embedx.server.protocol.openai import parse_openai
from embedx.server.protocol.tei import EXAMPLE_SPARSE_MODEL, parse_tei, parse_tei_sparse
from tests.support.fakes import cpu_info
from tests.support.models import MINILM_NAME, build_tiny_splade

KEY = "test-key"


def app_with(**settings: object) -> Any:
    """The real app on one fake CPU device; nothing loads until a request asks."""
    config = load_settings({"max_request_items": 8, **settings}, environ={})
    catalog = load_catalog(config.models_file)
    registry = ModelRegistry(config, catalog, [cpu_info()], CpuAccelerator)
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
        ("/v1/embeddings", {"model": "m", "input": "x", "input_type": "search_query"}),
        ("/v1/embeddings", {"model": "m", "input": "x", "input_type": ""}),
        ("/v1/embeddings", {"model": "m", "input": "x", "instruction": "i" * 4096}),
        ("/v1/embeddings", {"model": "m", "input": "x", "instruction": "i" * 4097}),
        ("/embed", {"model": "m", "inputs": "x", "prompt_name": "classification"}),
        ("/embed", {"model": "m", "inputs": "x", "input_type": 5}),  # not TEI's: ignored
        ("/embed", {"model": "m", "inputs": "x", "instruction": 5}),
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


PARSERS: dict[str, Callable[[bytes], Any]] = {
    "/v1/embeddings": lambda body: parse_openai(body, 8),
    "/embed": lambda body: parse_tei(body, 8, None),  # a server with no default model
    "/embed_sparse": lambda body: parse_tei_sparse(body, 8, None),
}


@pytest.mark.parametrize("path", PARSERS)
def test_the_checks_take_every_body_the_document_allows_and_refuse_every_other(
    path: str,
) -> None:
    """Bodies schemathesis makes from the document, valid and not, against the checks alone:
    the server's other refusals depend on the model (dimensions past its width, a prompt it
    lacks), which no document states."""
    spec = openapi_spec(keyed=False, max_items=8, default_model=False)
    operation = schemathesis.openapi.from_dict(spec)[path]["POST"]
    validator = jsonschema_rs.Draft202012Validator(request_schema(spec, path))
    bodies = hypothesis.strategies.one_of([
        operation.as_strategy(mode, media_type="application/json")
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    ])  # fmt: skip

    @hypothesis.given(case=bodies)
    @hypothesis.settings(max_examples=100, derandomize=True, database=None, deadline=None,
                         suppress_health_check=list(hypothesis.HealthCheck))  # fmt: skip
    def agree(case: Any) -> None:
        # JSON values only, as schemathesis sends them: another media type is a 415 first
        hypothesis.assume(isinstance(case.body, dict | list | str | int | float | None))
        try:
            PARSERS[path](json.dumps(case.body, allow_nan=False).encode())
        except InvalidRequest:
            accepted = False
        else:
            accepted = True
        assert validator.is_valid(case.body) == accepted, case.body

    agree()


def fuzz(app: Any, headers: dict[str, str]) -> tuple[int, list[str], dict[str, set[int]]]:
    """schemathesis over the app's /openapi.json, in-process, every check but one, in its
    examples, coverage (the document's edge values) and fuzzing phases: the cases run, the
    failures found, and the statuses each operation answered. Positive data need not be
    accepted: a valid request may name a dimension past its model's width, or a prompt its
    model lacks, a 400 no document can foresee (the test above holds the checks and the
    document to each other)."""
    config = SchemathesisConfig.from_dict({
        "seed": 1,
        "cache": {"enabled": False},  # nothing carried over from an earlier run
        "workers": 1,
        "headers": headers,
        "phases": {"stateful": {"enabled": False}},
        "generation": {"max-examples": 10, "deterministic": True},
        "checks": {"positive_data_acceptance": {"enabled": False}},
    })  # fmt: skip
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config, headers=headers)
    cases = 0
    failures: list[str] = []
    answered: dict[str, set[int]] = {}
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            cases += len(recorder.cases)
            statuses = answered.setdefault(recorder.label, set())
            statuses.update(i.response.status_code for i in recorder.interactions.values()
                            if i.response is not None)  # fmt: skip
            for checks in recorder.checks.values():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        failed = check.failure_info
                        failure = f"{failed.failure.title}: {failed.failure.message}"
                        failures.append(f"{recorder.label} {failure}\n{failed.code_sample}")
        elif isinstance(event, events.NonFatalError | events.FatalError):
            failures.append(repr(event))
    return cases, failures, answered


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory, reference_texts: list[str]) -> Path:
    return build_tiny_splade(tmp_path_factory.mktemp("splade"), reference_texts)["max-relu"]


@pytest.fixture
def served_models(
    tmp_path: Path, tiny_classifiers: dict[str, Path], splade: Path
) -> dict[str, object]:
    """MiniLM and a reranker, preloaded: every operation's example can be answered, the
    scoring ones' by the reranker, the server's scorer for requests that name none; and a
    SPLADE model under /embed_sparse's example's name, loaded by its first request."""
    models = tmp_path / "models.toml"
    models.write_text(
        f'[models.reranker]\nsource = "{tiny_classifiers["bert-1"]}"\n'
        f'[models."{EXAMPLE_SPARSE_MODEL}"]\nsource = "{splade}"\n'
    )
    return {"models_file": str(models), "preload": f"{MINILM_NAME},reranker"}


def test_schemathesis_finds_no_5xx_and_no_answer_the_document_lacks(
    served_models: dict[str, object],
) -> None:
    cases, failures, answered = fuzz(app_with(**served_models), {})
    assert failures == []
    assert cases > 300
    # each operation answered 200 at least once: its body, real vectors among them, checked
    assert all(200 in statuses for statuses in answered.values()), answered


def test_schemathesis_finds_the_same_with_a_key(served_models: dict[str, object]) -> None:
    app = app_with(**served_models, api_key=KEY)
    cases, failures, answered = fuzz(app, {"Authorization": f"Bearer {KEY}"})
    assert failures == []
    assert cases > 300
    assert all({200, 401} <= statuses for label, statuses in answered.items()
               if label != "GET /health"), answered  # fmt: skip
