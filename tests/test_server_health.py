"""Device faults as an operator sees them: the real app in-process, its registry on two fake
CPU devices, one of which fails every batch."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from embedx.config import load_settings
from embedx.devices import CpuAccelerator
from embedx.engine import Engine
from embedx.errors import (
    EmbedxError,
    ModelsBusy,
    ModelUnavailable,
    NoDeviceAvailable,
    NoDeviceFits,
)
from embedx.models.catalog import ModelSpec, load_catalog
from embedx.models.pooling import Pooling
from embedx.registry import ModelRegistry
from embedx.registry import registry as registry_module
from embedx.server.app import create_app
from embedx.server.guard import Guard
from tests.support.fakes import SlowForward, cpu_info
from tests.support.server import metric
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.anyio


async def test_a_quarantined_device_makes_health_degraded_and_info_names_it(
    minilm_dir: Path, reference_texts: list[str], st_reference: np.ndarray
) -> None:
    settings = load_settings({"max_batch_tokens": "1024"}, environ={})
    catalog = load_catalog(None)
    catalog["m"] = ModelSpec(
        name="m", source=str(minilm_dir), pooling=Pooling.MEAN, max_seq_len=256
    )
    registry = ModelRegistry(settings, catalog, [cpu_info("good"), cpu_info("bad")], CpuAccelerator)
    app = create_app(settings, registry)
    async with registry.lease("m") as named:  # loaded; now break one device
        for replica in named.engine.replicas:
            if replica.accelerator.info.label == "bad":
                replica.model.forward = SlowForward(  # type: ignore[method-assign]
                    replica.model.forward, fail=lambda b, n: RuntimeError("ECC error (injected)")
                )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://embedx") as client:
        assert (await client.get("/health")).json()["status"] == "ok"
        response = await client.post(
            "/v1/embeddings", json={"model": "m", "input": reference_texts[:200]}
        )
        assert response.status_code == 200  # the good device finished everything
        vectors = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
        assert np.abs(vectors - st_reference[:200]).max() < 1e-5
        health = (await client.get("/health")).json()
        assert health["status"] == "degraded"
        assert "bad" in health["quarantined"][0]
        info = (await client.get("/info")).json()
        device = next(d for d in info["models"][0]["devices"] if d["device"] == "bad")
        assert device["state"] == "quarantined"
        assert "ECC error" in device["reason"]
        metrics = (await client.get("/metrics")).text
        assert metric(metrics, "embedx_device_up", model="m", device="bad") == 0
        assert metric(metrics, "embedx_device_up", model="m", device="good") == 1
        # answered requests count under their route, none as a client hang-up (499)
        answered = {"route": "/v1/embeddings", "method": "POST"}
        assert metric(metrics, "embedx_requests_total", **answered, status="200") == 1
        assert metric(metrics, "embedx_requests_total", **answered, status="499") is None
    await registry.drain(5)


async def test_a_preloaded_model_whose_every_device_failed_loads_again_by_itself(
    minilm_dir: Path,
) -> None:
    """A passing fault (a transient driver error, say) must not leave the model refusing
    every request until the server restarts, nor a preloaded one unloaded until a request
    comes."""
    registry, app = await _preloaded_on_one_device(minilm_dir)
    async with registry.lease("m") as engine:
        _break_every_device(engine.engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://embedx") as client:
        body = {"model": "m", "input": ["a text", "another"]}
        failed = await client.post("/v1/embeddings", json=body)
        assert failed.status_code == 503
        assert failed.json()["error"]["code"] == "no_device_available"
        assert "Xid 79" in failed.json()["error"]["message"]
        await _until_loaded(registry, "m")  # with no request asking
        assert registry.loads.done == 2
        assert (await client.get("/health")).json()["status"] == "ok"
        served = await client.post("/v1/embeddings", json=body)
        assert served.status_code == 200, served.text
        assert (await client.get("/health")).json()["status"] == "ok"
        # under steady traffic too: a request still holding the broken engine does not
        # keep the next one from loading it afresh
        async with registry.lease("m") as engine:
            _break_every_device(engine.engine)
            failed = await client.post("/v1/embeddings", json=body)
            assert failed.status_code == 503
            served = await client.post("/v1/embeddings", json=body)
            assert served.status_code == 200, served.text
    assert registry.loads.done == 3
    await registry.drain(5)


@pytest.mark.parametrize(
    ("lost", "code"),
    [
        (ModelUnavailable("the device is gone (injected)"), "model_unavailable"),
        # not remembered for requests (others' memory frees), yet the model is not served
        (NoDeviceFits("the device is full (injected)"), "no_device_fits"),
    ],
)
async def test_a_preloaded_model_that_cannot_load_again_fails_health_until_it_does(
    minilm_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    lost: EmbedxError,
    code: str,
) -> None:
    """A fault that outlives the model (a CUDA context broken for good) leaves the server
    unable to serve what it was started for: /health says so with a 503, which orchestrators
    act on, and the server keeps trying to load it."""
    monkeypatch.setattr(registry_module, "FAILED_LOAD_MEMORY_S", 0.3)
    registry, app = await _preloaded_on_one_device(minilm_dir)
    device_lost = True
    real_load = Engine.load

    async def load(*args: Any) -> Engine:
        if device_lost:
            raise lost
        return await real_load(*args)

    monkeypatch.setattr(Engine, "load", load)
    async with registry.lease("m") as engine:
        _break_every_device(engine.engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://embedx") as client:
        body = {"model": "m", "input": ["a text"]}
        assert (await client.post("/v1/embeddings", json=body)).status_code == 503

        async def failing() -> httpx.Response | None:  # its load again fails at once
            health = await client.get("/health")
            return health if health.status_code == 503 else None

        health = await eventually_async(failing)
        assert health is not None
        assert health.json()["status"] == "failing"
        assert health.json()["failing"] == ["m"]
        metrics = (await client.get("/metrics")).text
        assert metric(metrics, "embedx_models_failing") == 1
        assert metric(metrics, "embedx_model_load_failures_total", code=code)
        # the outage is in a log kept at the warning level: the device out, the load failed
        logged = [(r.levelno, r.getMessage()) for r in caplog.records]
        assert (logging.WARNING, "m: only taken out of service: " + _first_reason(logged)) in logged
        assert (logging.ERROR, f"loading m failed: {lost.message}") in logged
        device_lost = False  # the next try, 0.3 s on, loads it
        await _until_loaded(registry, "m")
        health = await client.get("/health")
        assert health.status_code == 200, health.text
        assert health.json()["status"] == "ok"
        assert metric((await client.get("/metrics")).text, "embedx_models_failing") == 0
        assert (await client.post("/v1/embeddings", json=body)).status_code == 200
    await registry.drain(5)


async def test_a_preloaded_model_with_no_slot_free_to_load_again_tries_later(
    minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every slot held by models in use when it lost its devices: it is tried again, not
    left unloaded until a request happens to come."""
    monkeypatch.setattr(registry_module, "FAILED_LOAD_MEMORY_S", 0.2)
    registry, _ = await _preloaded_on_one_device(minilm_dir)
    reserve = registry._reserve
    refusals = 0

    def busy_once(spec: ModelSpec) -> Any:
        nonlocal refusals
        if refusals == 0:
            refusals += 1
            raise ModelsBusy("every slot holds a model in use (injected)")
        return reserve(spec)

    monkeypatch.setattr(registry, "_reserve", busy_once)
    async with registry.lease("m") as engine:
        _break_every_device(engine.engine)
        with pytest.raises(NoDeviceAvailable):
            await engine.embed(["a text"])
    await _until_loaded(registry, "m")  # refused once, loaded on the next try
    assert refusals == 1
    await registry.drain(5)


async def _preloaded_on_one_device(minilm_dir: Path) -> tuple[ModelRegistry, Guard]:
    """The real app, its registry holding MiniLM as `m`, preloaded on one fake CPU device."""
    settings = load_settings({}, environ={})
    catalog = load_catalog(None)
    catalog["m"] = ModelSpec(name="m", source=str(minilm_dir), pooling=Pooling.MEAN)
    registry = ModelRegistry(settings, catalog, [cpu_info("only")], CpuAccelerator)
    app = create_app(settings, registry)
    await registry.preload(["m"])
    return registry, app


def _break_every_device(engine: Engine) -> None:
    """Every batch of the engine fails from now on, as after a GPU's Xid error."""
    for replica in engine.replicas:
        replica.model.forward = SlowForward(  # type: ignore[method-assign]
            replica.model.forward, fail=lambda b, n: RuntimeError("Xid 79 (injected)")
        )


def _first_reason(logged: list[tuple[int, str]]) -> str:
    return next(m for _, m in logged if "taken out of service" in m).split("service: ", 1)[1]


async def _until_loaded(registry: ModelRegistry, name: str) -> None:
    """Wait for the model to be resident and serving."""

    def serving() -> bool:
        resident = next((r for r in registry.residents() if r.spec.name == name), None)
        return resident is not None and resident.engine is not None and resident.engine.serving

    await eventually_async(serving, message=f"{name} did not load")
