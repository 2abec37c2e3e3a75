"""Device faults as an operator sees them: the real app in-process, its registry on two fake
CPU devices, one of which fails every batch."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from embedx.config import load_settings
from embedx.devices import CpuAccelerator
from embedx.models.catalog import ModelSpec, load_catalog
from embedx.models.pooling import Pooling
from embedx.registry import ModelRegistry
from embedx.server.app import create_app
from tests.conftest import SlowForward, cpu_info

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
    async with registry.lease("m") as engine:  # loaded; now break one device
        for replica in engine.replicas:
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
        assert "embedx_device_up" in metrics
        # answered requests count under their route, none as a client hang-up (499)
        assert 'route="/v1/embeddings",method="POST",status="200"' in metrics
        assert 'status="499"' not in metrics
    await registry.drain(5)
