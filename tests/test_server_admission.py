"""Admission: request slots and the byte budget alone, and through the app in this process
(a request past the limit waits, then gets a 503; one waiting for its model's load holds no
slot; the residency cap full of busy models is a 503)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from embedx.config import load_settings
from embedx.devices import CpuAccelerator
from embedx.engine import Engine
from embedx.errors import QueueTimeout
from embedx.models.catalog import ModelSpec, load_catalog
from embedx.models.pooling import Pooling
from embedx.registry import ModelRegistry
from embedx.server.admission import Admission, ByteBudget
from tests.support.fakes import cpu_info
from tests.support.models import MINILM_NAME
from tests.support.server import assert_envelope, in_process
from tests.support.waiting import PATIENCE_S, next_turn

pytestmark = pytest.mark.anyio


# -- request slots -------------------------------------------------------------------------------


async def test_a_queue_timeout_of_0_takes_a_free_slot_and_refuses_only_when_none_is() -> None:
    admission = Admission(1, 0.0)
    async with admission.slot():  # free: taken, whatever the timeout
        with pytest.raises(QueueTimeout):  # none free: refused at once, not queued
            async with admission.slot():
                pass
    assert admission.timeouts == 1


async def test_a_request_cancelled_as_its_slot_frees_does_not_run() -> None:
    admission = Admission(1, 30.0)
    entered: list[str] = []
    first_done = asyncio.Event()

    async def request(name: str, hold: asyncio.Event) -> None:
        async with admission.slot():
            entered.append(name)
            await hold.wait()

    first = asyncio.create_task(request("first", first_done))
    await next_turn()  # a turn of the loop: its first step takes the free slot
    assert admission.running == 1
    second = asyncio.create_task(request("second, its client gone", asyncio.Event()))
    await next_turn()  # its first step waits for the slot
    assert admission.waiting == 1
    first_done.set()
    await next_turn()  # `first` leaves its slot, which the semaphore hands to `second`...
    second.cancel()  # ...whose client hangs up in the same turn (3.11's wait_for ran it anyway)
    await asyncio.gather(first, second, return_exceptions=True)
    assert entered == ["first"]
    assert admission.running == 0
    async with admission.slot():  # the slot is free again
        pass


async def test_requests_past_the_concurrency_limit_wait_then_get_a_503() -> None:
    settings = {"max_concurrent_requests": 1, "request_queue_timeout_s": 0.3}
    async with in_process(settings) as busy:
        async with busy.state.admission.slot():  # a request running
            body = {"model": MINILM_NAME, "input": "x"}
            refused = await busy.client.post("/v1/embeddings", json=body)
        assert_envelope(refused, 503, "queue_timeout")
        assert refused.headers["retry-after"]
        assert (await busy.client.get("/health")).status_code == 200
        assert (await busy.client.post("/v1/embeddings", json=body)).status_code == 200


async def test_requests_waiting_for_a_load_hold_no_slot_that_a_loaded_model_needs(
    minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loading = asyncio.Event()
    original = Engine.load.__func__  # type: ignore[attr-defined]

    async def hanging_for_cold(cls: type, spec: ModelSpec, *args: object) -> object:
        if spec.name == "cold":
            loading.set()
            await asyncio.Event().wait()  # a load that never ends (cancelled below)
        return await original(cls, spec, *args)

    monkeypatch.setattr(Engine, "load", classmethod(hanging_for_cold))
    limits = {"max_concurrent_requests": "1", "request_queue_timeout_s": "5", "preload": "warm"}
    settings = load_settings(limits, environ={})
    catalog = load_catalog(None)
    for name, length in (("warm", None), ("cold", 128)):  # cold: its own copy, to load
        catalog[name] = ModelSpec(
            name=name, source=str(minilm_dir), pooling=Pooling.MEAN, max_seq_len=length
        )
    registry = ModelRegistry(settings, catalog, [cpu_info()], CpuAccelerator)
    async with in_process(registry=registry) as app:
        cold = asyncio.create_task(
            app.client.post("/v1/embeddings", json={"model": "cold", "input": "x"})
        )
        await asyncio.wait_for(loading.wait(), PATIENCE_S)
        warm = await app.client.post("/v1/embeddings", json={"model": "warm", "input": "x"})
        assert warm.status_code == 200, warm.text  # not a 503 queue_timeout behind the load
        cold.cancel()


async def test_the_residency_cap_with_every_model_busy_is_a_503(minilm_dir: Path) -> None:
    # not preloaded: a preloaded model is never evicted to make room
    settings = {"max_loaded_models": 1, "allow_local_paths": "true"}
    async with in_process(settings) as capped:
        client = capped.client
        assert (
            await client.post("/v1/embeddings", json={"model": MINILM_NAME, "input": "x"})
        ).is_success
        other = {"model": str(minilm_dir), "input": "x", "pooling": "mean"}
        async with capped.state.registry.lease(MINILM_NAME):  # a request using it
            refused = await client.post("/v1/embeddings", json=other)
        assert_envelope(refused, 503, "models_busy")
        assert (await client.post("/v1/embeddings", json=other)).status_code == 200  # now it fits


# -- the byte budget -----------------------------------------------------------------------------


async def test_a_small_body_that_fits_passes_a_large_one_waiting_which_then_runs_alone() -> None:
    budget = ByteBudget(100, 60.0)
    first = await budget.reserve(60)
    order: list[str] = []

    async def reserve(name: str, size: int) -> int:
        taken = await budget.reserve(size)
        order.append(name)
        return taken

    large = asyncio.create_task(reserve("large", 1000))  # the whole budget, once it is free
    await next_turn()
    small = await reserve("small", 10)  # fits beside the first: not held up by the large one
    assert order == ["small"]
    budget.release(first)
    assert not large.done()
    budget.release(small)
    assert await large == 100
    assert budget.held == 100


async def test_a_wait_given_up_gives_its_place_and_its_bytes_back() -> None:
    budget = ByteBudget(100, 60.0)
    held = await budget.reserve(100)
    gone = asyncio.create_task(budget.reserve(80))  # its client leaves while it waits
    await next_turn()
    behind = asyncio.create_task(budget.reserve(30))
    await next_turn()
    budget.release(held)  # grants `gone`, whose task is cancelled before it resumes
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert await behind == 30
    assert budget.held == 30


async def test_a_wait_past_the_queue_timeout_is_a_503() -> None:
    budget = ByteBudget(100, 0.0)
    await budget.reserve(100)
    with pytest.raises(QueueTimeout, match="EMBEDX_MAX_BODY_BYTES_IN_FLIGHT"):
        await budget.reserve(1)
    assert budget.timeouts == 1
