"""The operational routes in this process: /info, /metrics as Prometheus text, and /docs and
/openapi.json describing every route."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from embedx.allocator import allocator
from embedx.server.app import ROUTES
from tests.support.models import MINILM_NAME
from tests.support.server import InProcess, in_process, metric, resolved, samples

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide: the app below serves every test of the module


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[InProcess]:
    async with in_process({"preload": MINILM_NAME}) as app:
        yield app


async def test_info_shows_settings_devices_counters_and_models(served: InProcess) -> None:
    texts = [f"text {i} for the counters, " + "with words enough to count " * 4 for i in range(100)]
    body = {"model": MINILM_NAME, "input": texts}
    assert (await served.client.post("/v1/embeddings", json=body)).is_success
    info = (await served.client.get("/info")).json()
    assert info["settings"]["api_key"] == "unset"
    assert info["devices"][0]["device"] == "cpu"
    assert info["allocator"] == allocator()
    assert {
        "inputs_limit",
        "inputs_held",
        "running",
        "waiting",
        "http_in_flight",
        "http_receiving",
    } <= set(info["requests"])
    model = next(m for m in info["models"] if m["model"] == MINILM_NAME)
    for key in ("pooling", "dimensions", "max_seq_len", "devices", "idle_s", "truncated_inputs"):
        assert key in model
    assert model["devices"][0]["dtype"] == "float32"
    assert model["devices"][0]["time_spread"] >= 0
    assert model["devices"][0]["padding_rows"] == 0  # the CPU runs each batch's exact rows
    assert model["devices"][0]["launching_s"] > 0
    assert model["tokenizer"]["calls"] >= 1
    assert model["tokenizer"]["busy_s"] > 0
    for key in ("collect_s", "idle_s", "free_s"):  # in ms, rounded: too few texts here to show
        assert key in model["tokenizer"]
    assert model["tokenizer"]["cut_at_chars"] == 16 * model["max_seq_len"]
    assert model["tokenizer"]["read_at_most_chars"] == 64 * model["max_seq_len"]
    assert model["tokenizer"]["cut"] == model["tokenizer"]["cut_at_bound"] == 0


ENGINE_SAMPLES = (
    "embedx_queue_items", "embedx_batch_tokens_bucket", "embedx_device_busy_seconds_total",
    "embedx_padding_tokens_total", "embedx_embed_seconds_count",
    "embedx_tokenizer_busy_seconds_total", "embedx_tokenizer_collect_seconds_total",
)  # fmt: skip


async def test_metrics_are_prometheus_text_by_route_method_status_and_code(
    served: InProcess,
) -> None:
    client = served.client
    answered = {"route": "/v1/embeddings", "method": "POST", "status": "200"}
    before = metric((await client.get("/metrics")).text, "embedx_requests_total", **answered)
    await client.post("/v1/embeddings", json={"model": MINILM_NAME, "input": "count me"})
    response = await client.get("/metrics")
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = response.text
    for name in ENGINE_SAMPLES:
        assert {"model": MINILM_NAME} in [
            {k: v for k, v in labels.items() if k == "model"} for labels in samples(text, name)
        ], name
    assert metric(text, "embedx_model_load_seconds_count") == 1
    assert metric(text, "embedx_requests_total", **answered) == (before or 0) + 1
    made_up = "MADEUP" + "X" * 500  # any token is a method to HTTP: counted as "other"
    assert (await client.request(made_up, "/health")).status_code == 405
    await client.post("/v1/embeddings", json={"model": "no/such-model-anywhere", "input": "x"})
    text = (await client.get("/metrics")).text
    assert made_up not in text
    assert metric(text, "embedx_requests_total", route="/health", method="other", status="405")
    # errors by their code, whether a route (its check) or the guard (no key, a bad target)
    # answered: a 503 alone does not say whether to add devices or fix a model
    assert metric(text, "embedx_request_errors_total", route="/v1/embeddings", status="404",
                  code="model_not_found") == 1  # fmt: skip
    assert metric(text, "embedx_request_errors_total", route="/health", status="405",
                  code="method_not_allowed") == 1  # fmt: skip
    buckets = [labels["le"] for labels in samples(text, "embedx_request_seconds_bucket")
               if labels["route"] == "/health"]  # fmt: skip
    assert buckets == ["0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
                       "0.5", "1", "2.5", "5", "10", "30", "+Inf"]  # fmt: skip


async def test_metrics_keep_every_digit_and_any_model_name(served: InProcess) -> None:
    """A counter past a million keeps its last digit (rate() over it would move in steps
    otherwise), and a model's name, which can hold any character, comes back as it was."""
    health = {"route": "/health", "method": "GET", "status": "200"}
    before = metric((await served.client.get("/metrics")).text, "embedx_requests_total", **health)
    served.state.http.requests[("/health", "GET", 200)] += 1_234_567
    name = 'a\\b"c\nd'
    registry = served.state.registry
    # a length of its own: its own copy of MiniLM's weights, and so its own series
    entry = registry.catalog[MINILM_NAME]
    registry.catalog[name] = dataclasses.replace(entry, name=name, max_seq_len=128)
    async with registry.lease(name):
        text = (await served.client.get("/metrics")).text
    assert metric(text, "embedx_requests_total", **health) == (before or 0) + 1_234_567
    assert metric(text, "embedx_queue_items", model=name) == 0


async def test_docs_and_openapi_describe_every_route(served: InProcess) -> None:
    client = served.client
    spec = (await client.get("/openapi.json")).json()
    page = (await client.get("/docs")).text
    for method, route, _ in ROUTES:
        path = route.replace("{path:", "{")  # BlackSheep's parameter that takes slashes
        assert method.lower() in spec["paths"][path]
        assert f"{method} {path}" in page
        assert {"405", "500"} <= set(spec["paths"][path][method.lower()]["responses"])
    busy = spec["paths"]["/v1/embeddings"]["post"]["responses"]["503"]
    assert "Retry-After" in busy["headers"]

    def documented(path: str) -> set[str]:
        schema = spec["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
        return set(schema["schema"]["properties"])

    card = (await client.get("/v1/models")).json()["data"][0]
    assert set(card) == documented("/v1/models/{model}")
    assert set((await client.get("/health")).json()) == documented("/health")
    assert set((await client.get("/info")).json()) == documented("/info")
    request = spec["paths"]["/v1/embeddings"]["post"]["requestBody"]
    assert "input" in request["content"]["application/json"]["schema"]["properties"]


async def test_the_operator_may_ask_info_to_show_where_models_lie(
    tmp_path: Path, minilm_dir: Path
) -> None:
    models = tmp_path / "models.toml"
    models.write_text(f'[models.local-minilm]\nsource = "{minilm_dir}"\npooling = "mean"\n')
    settings = {"models_file": models, "preload": "local-minilm", "show_model_sources": "true"}
    async with in_process(settings) as shown:
        info = (await shown.client.get("/info")).json()
    (model,) = info["models"]
    assert model["source"] == str(minilm_dir)
    assert model["directory"] == resolved(minilm_dir)
    assert info["settings"]["models_file"] == str(models)
