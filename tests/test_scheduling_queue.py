"""ConvergingQueue: each text delivered once, oldest first, cancelled and failed work let go."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedx.errors import EmbeddingFailed, NoDeviceAvailable
from embedx.scheduling import ConvergingQueue, Item, Job
from tests.support.queues import Clock, job_of, lognormal_lengths
from tests.support.simulation import Arrival, FakeDevice, simulate_converging


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(st.floats(0, 0.05), st.lists(st.integers(1, 512), min_size=1, max_size=80)),
        min_size=1,
        max_size=6,
    ),
    speeds=st.lists(st.floats(1e4, 1e6), min_size=1, max_size=5),
    budget=st.integers(64, 20000),
)
def test_every_item_is_delivered_exactly_once(
    jobs: list[tuple[float, list[int]]], speeds: list[float], budget: int
) -> None:
    devices = [
        FakeDevice(f"d{i}", rate, 0.0005, budget, 2 if i % 2 == 0 else 1)
        for i, rate in enumerate(speeds)
    ]
    arrivals = [Arrival(at, tuple(lengths)) for at, lengths in jobs]
    result = simulate_converging(devices, arrivals)
    for delivered in result.delivered:
        assert delivered == [1] * len(delivered)


def test_a_request_arriving_mid_job_joins_the_same_queue() -> None:
    clock = Clock()
    queue = ConvergingQueue(clock=clock)
    device = queue.add_device("d", budget=10_000, rate=1e6)
    first = job_of(queue, [10] * 5)
    claim = queue.claim(device)
    assert claim is not None
    second = job_of(queue, [10] * 3)
    queue.complete(claim, 0.001)
    claim = queue.claim(device)
    assert claim is not None
    assert {id(item.job) for item in claim.items} == {id(second)}
    queue.complete(claim, 0.001)
    assert first.remaining == 0
    assert second.remaining == 0


def test_the_oldest_generation_is_served_before_newcomers() -> None:
    clock = Clock()
    queue = ConvergingQueue(clock=clock)
    device = queue.add_device("d", budget=100, rate=1e6)
    old = job_of(queue, [50] * 4)  # two batches' worth
    claim = queue.claim(device)
    assert claim is not None  # seals the first generation
    job_of(queue, [5] * 10)  # short newcomers: the SHORT end would favour them
    queue.complete(claim)
    claim = queue.claim(device)
    assert claim is not None
    assert claim.items[0].job is old


def test_under_continuous_load_no_request_starves() -> None:
    rng = random.Random(3)
    devices = [FakeDevice("fast", 4e5, 0.002, 16384, 2), FakeDevice("slow", 1e5, 0.002, 4096)]
    capacity = 5e5
    arrivals, at = [], 0.0
    for _ in range(300):
        lengths = tuple(lognormal_lengths(rng.randint(1, 40), rng.randint(0, 10**6)))
        at += rng.expovariate(0.8 * capacity / (sum(lengths) or 1))
        arrivals.append(Arrival(at, lengths))
    result = simulate_converging(devices, arrivals)
    latencies = sorted(done - start for start, done in result.job_times)
    assert latencies[-1] < 0.5  # no request waits behind an endless stream of newcomers


def test_a_cancelled_request_has_its_pending_items_dropped() -> None:
    queue = ConvergingQueue(clock=Clock())
    device = queue.add_device("d", budget=1000, rate=1e6)
    gone = job_of(queue, [10] * 20)
    kept = job_of(queue, [10] * 3)
    queue.cancel(gone)
    assert queue.pending_items == 3
    claim = queue.claim(device)
    assert claim is not None
    assert all(item.job is kept for item in claim.items)


def test_closing_fails_a_job_still_being_fed_with_the_closing_error() -> None:
    """A request whose texts are still being tokenized, none queued now, hears why at once,
    not the queue's generic refusal at its next chunk."""
    queue = ConvergingQueue(clock=Clock())
    device = queue.add_device("d", budget=1000, rate=1e6)
    feeding = Job(20)
    queue.feeding_started(feeding)
    queue.submit(feeding, [Item(feeding, i, 10) for i in range(5)])
    claim = queue.claim(device)
    assert claim is not None
    queue.complete(claim)  # nothing of it queued now; 15 texts still to come
    closing = NoDeviceAvailable("the server shut down before this request finished")
    queue.close(closing)
    assert feeding.error is closing


def test_a_cancelled_or_failed_job_lets_go_of_its_rows_at_once() -> None:
    """Its items stay queued until a claim sweeps them, which an idle server never makes:
    its output array (N x D floats) must not stay with them."""
    queue = ConvergingQueue(clock=Clock(), quarantine_after=100, max_item_attempts=1)
    device = queue.add_device("d", budget=1000, rate=1e6)
    gone, failed = job_of(queue, [10] * 5), job_of(queue, [10])
    gone.out = failed.out = bytearray(1 << 20)
    queue.cancel(gone)
    claim = queue.claim(device)
    assert claim is not None
    queue.fail(claim, RuntimeError("poison"))
    assert failed.error is not None
    assert gone.out is None
    assert failed.out is None


def test_texts_of_a_failed_request_still_being_tokenized_are_not_queued() -> None:
    """A request fails (its text failed in every batch) while its later chunks are still
    being tokenized: those chunks are dropped, not counted as pending work forever."""
    queue = ConvergingQueue(clock=Clock(), quarantine_after=100)
    device = queue.add_device("d", budget=1000, rate=1e6)
    job = Job(3)
    queue.submit(job, [Item(job, 0, 10)])
    while (claim := queue.claim(device)) is not None:
        queue.fail(claim, RuntimeError("poison"))
    assert isinstance(job.error, EmbeddingFailed)
    queue.submit(job, [Item(job, 1, 10), Item(job, 2, 10)])  # its next chunk, tokenized late
    assert queue.pending_items == 0
    assert queue.pending_tokens == 0
    assert queue.claim(device) is None


def test_an_item_that_fails_everywhere_fails_its_job_with_a_clear_error() -> None:
    queue = ConvergingQueue(clock=Clock(), quarantine_after=100)
    device = queue.add_device("d", budget=1000, rate=1e6)
    job = job_of(queue, [10])
    while (claim := queue.claim(device)) is not None:
        queue.fail(claim, RuntimeError("poison"))
    assert isinstance(job.error, EmbeddingFailed)
    assert "poison" in str(job.error)


def test_when_every_device_is_quarantined_pending_jobs_fail() -> None:
    queue = ConvergingQueue(clock=Clock())
    device = queue.add_device("d", budget=1000, rate=1e6)
    job = job_of(queue, [10] * 3)
    queue.quarantine(device, "gone")
    assert isinstance(job.error, NoDeviceAvailable)
    with pytest.raises(NoDeviceAvailable):
        job_of(queue, [1])
