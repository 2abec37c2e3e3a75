"""Admission: the inputs in flight and the byte budget alone, and through the app in this
process (a request past the limit waits, then gets a 503; one waiting for its model's load
holds no inputs; the residency cap full of busy models is a 503)."""

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
from embedx.server.admission import Admission, Budget
from tests.support.fakes import cpu_info
from tests.support.models import MINILM_NAME
from tests.support.server import assert_envelope, in_process
from tests.support.waiting import PATIENCE_S, eventually_async, next_turn

pytestmark = pytest.mark.anyio


# -- inputs in flight ----------------------------------------------------------------------------


async def test_a_queue_timeout_of_0_takes_free_inputs_and_refuses_only_when_too_few_are() -> None:
    admission = Admission(3, 0.0)
    # free: taken, whatever the timeout; then the one left
    async with admission.slot(2), admission.slot(1):
        with pytest.raises(QueueTimeout, match="EMBEDX_MAX_INPUTS_IN_FLIGHT"):
            async with admission.slot(1):  # none left: refused at once, not queued
                pass
    assert admission.inputs.timeouts == 1
    assert admission.inputs.held == 0


async def test_small_requests_run_together_up_to_the_inputs_limit() -> None:
    admission = Admission(8, 30.0)
    release = asyncio.Event()

    async def one_text() -> None:
        async with admission.slot(1):
            await release.wait()

    running = [asyncio.create_task(one_text()) for _ in range(10)]
    await next_turn()
    assert (admission.running, admission.waiting) == (8, 2)  # by inputs, not requests
    release.set()
    await asyncio.gather(*running)
    assert (admission.running, admission.waiting, admission.inputs.held) == (0, 0, 0)


async def test_a_large_request_waiting_is_not_passed_by_small_ones_and_then_runs_alone() -> None:
    admission = Admission(8, 30.0)
    order: list[str] = []
    finish = {name: asyncio.Event() for name in ("first", "large", "small")}

    async def request(name: str, inputs: int) -> None:
        async with admission.slot(inputs):
            order.append(name)
            assert admission.running == 1 or name != "large"  # it runs alone
            await finish[name].wait()

    first = asyncio.create_task(request("first", 4))
    await next_turn()
    large = asyncio.create_task(request("large", 100))  # more than the limit: all of it
    await next_turn()
    small = asyncio.create_task(request("small", 1))  # it would fit beside the first
    await next_turn()
    assert order == ["first"]  # arrival order: the small one waits behind the large one
    finish["first"].set()
    await eventually_async(lambda: len(order) > 1)
    assert order == ["first", "large"]
    await next_turn()
    assert order == ["first", "large"]  # the small one waits for the large one, alone
    finish["large"].set()
    finish["small"].set()
    await asyncio.gather(first, large, small)
    assert order == ["first", "large", "small"]


async def test_a_large_request_given_up_lets_those_behind_it_in() -> None:
    admission = Admission(8, 30.0)
    async with admission.slot(4):
        large = asyncio.create_task(admission.inputs.reserve(100))  # its client will leave
        await next_turn()
        small = asyncio.create_task(admission.inputs.reserve(1))  # fits, but waits in order
        await next_turn()
        assert not small.done()
        large.cancel()
        assert await asyncio.wait_for(small, PATIENCE_S) == 1  # in before the 4 come back
        assert admission.inputs.held == 5


async def test_a_request_cancelled_as_its_slot_frees_does_not_run() -> None:
    admission = Admission(1, 30.0)
    entered: list[str] = []
    first_done = asyncio.Event()

    async def request(name: str, hold: asyncio.Event) -> None:
        async with admission.slot(1):
            entered.append(name)
            await hold.wait()

    first = asyncio.create_task(request("first", first_done))
    await next_turn()  # a turn of the loop: its first step takes the free slot
    assert admission.running == 1
    second = asyncio.create_task(request("second, its client gone", asyncio.Event()))
    await next_turn()  # its first step waits for the slot
    assert admission.waiting == 1
    first_done.set()
    await next_turn()  # `first` gives its input back, which the budget hands to `second`...
    second.cancel()  # ...whose client hangs up in the same turn (3.11's wait_for ran it anyway)
    await asyncio.gather(first, second, return_exceptions=True)
    assert entered == ["first"]
    assert admission.running == 0
    async with admission.slot(1):  # the input is free again
        pass


async def test_requests_past_the_inputs_limit_wait_then_get_a_503() -> None:
    settings = {"max_inputs_in_flight": 1, "request_queue_timeout_s": 0.3}
    async with in_process(settings) as busy:
        async with busy.state.admission.slot(1):  # a request running
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
    limits = {"max_inputs_in_flight": "1", "request_queue_timeout_s": "5", "preload": "warm"}
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
    budget = Budget(100, 60.0, "bytes", "EMBEDX_MAX_BODY_BYTES_IN_FLIGHT")
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
    budget = Budget(100, 60.0, "bytes", "EMBEDX_MAX_BODY_BYTES_IN_FLIGHT")
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
    budget = Budget(100, 0.0, "bytes", "EMBEDX_MAX_BODY_BYTES_IN_FLIGHT")
    await budget.reserve(100)
    with pytest.raises(QueueTimeout, match="EMBEDX_MAX_BODY_BYTES_IN_FLIGHT"):
        await budget.reserve(1)
    assert budget.timeouts == 1
