"""Device health: out of memory halves a budget until it regrows; failing devices go out."""

from __future__ import annotations

import pytest

from embedx.scheduling import REGROW_AFTER, ConvergingQueue
from tests.support.queues import Clock, job_of


def test_oom_halves_budget_and_requeues_both_halves() -> None:
    queue = ConvergingQueue(clock=Clock())
    device = queue.add_device("d", budget=1000, rate=1e6)
    job = job_of(queue, [100] * 10)
    claim = queue.claim(device)
    assert claim is not None
    assert len(claim.items) == 10
    queue.fail(claim, MemoryError("injected"), out_of_memory=True)
    assert device.budget == 500
    assert device.active
    taken = []
    while (claim := queue.claim(device)) is not None:
        assert len(claim.items) <= 5
        taken.extend(claim.items)
        queue.complete(claim)
    assert sorted(i.index for i in taken) == list(range(10))
    assert job.remaining == 0
    # once enough batches have run at half, the budget it was given comes back
    job_of(queue, [100] * 5 * REGROW_AFTER)  # REGROW_AFTER batches of 5 at the halved 500
    while (claim := queue.claim(device)) is not None:
        queue.complete(claim)
    assert device.budget == 1000


def test_running_out_of_memory_on_batches_of_many_texts_fails_neither_texts_nor_device() -> None:
    """The batch's size is at fault: five in a row (more than a text's four attempts, or a
    device's three failures) only shrink the batches."""
    queue = ConvergingQueue(clock=Clock())
    device = queue.add_device("d", budget=100_000, rate=1e6)
    job = job_of(queue, [100] * 100)
    for _ in range(5):
        claim = queue.claim(device)
        assert claim is not None
        assert len(claim.items) > 1
        queue.fail(claim, MemoryError("injected"), out_of_memory=True)
    assert device.active
    while (claim := queue.claim(device)) is not None:
        queue.complete(claim)
    assert job.error is None
    assert job.remaining == 0


def test_oom_on_a_small_batch_halves_the_budget_not_the_batch() -> None:
    queue = ConvergingQueue(clock=Clock())
    device = queue.add_device("d", budget=16384, rate=1e6)
    job_of(queue, [300])
    claim = queue.claim(device)
    assert claim is not None
    queue.fail(claim, MemoryError("injected"), out_of_memory=True)  # another model loading
    assert device.budget == 8192  # was 150: a 128,000-token job then took 1,000 batches


def test_a_device_short_of_memory_for_one_text_goes_out_before_it_fails_any() -> None:
    """A co-tenant holds its memory: every batch runs out, down to one text. Those count
    against the device, which goes out after three, while no text has failed four times:
    the healthy device runs them all. (One-text failures counted only against the texts, and
    67 of them failed a request the other device could have run.)"""
    queue = ConvergingQueue(clock=Clock())
    healthy = queue.add_device("healthy", budget=8192, rate=1e6)
    full = queue.add_device("full", budget=8192, rate=1e6)
    job = job_of(queue, [100] * 40)
    running = queue.claim(healthy)
    assert running is not None
    while (claim := queue.claim(full)) is not None:
        queue.fail(claim, MemoryError("CUDA out of memory (injected)"), out_of_memory=True)
    assert not full.active
    assert "out of memory" in (full.reason or "")
    queue.complete(running)
    while (claim := queue.claim(healthy)) is not None:
        queue.complete(claim)
    assert job.error is None
    assert job.remaining == 0


def test_a_device_that_keeps_failing_is_quarantined_and_its_work_goes_to_the_others() -> None:
    queue = ConvergingQueue(clock=Clock())
    bad = queue.add_device("bad", budget=100, rate=1e7)
    good = queue.add_device("good", budget=100, rate=1e5)
    job = job_of(queue, [10] * 30)
    for _ in range(3):
        claim = queue.claim(bad)
        assert claim is not None
        queue.fail(claim, RuntimeError("injected"))
    assert not bad.active
    assert "injected" in (bad.reason or "")
    while (claim := queue.claim(good)) is not None:
        queue.complete(claim)
    assert job.remaining == 0
    assert job.error is None


def test_a_device_failing_most_batches_between_successes_is_quarantined_and_loses_nothing() -> None:
    """Failing two batches of three: a success between failures does not clear its record,
    and the items it failed are not failed for its sake."""
    queue = ConvergingQueue(clock=Clock())
    flaky = queue.add_device("flaky", budget=50, rate=1e7)
    good = queue.add_device("good", budget=50, rate=1e5)
    jobs = [job_of(queue, [10] * 12) for _ in range(6)]
    batches = 0
    while flaky.active and (claim := queue.claim(flaky)) is not None:
        batches += 1
        if batches % 3:
            queue.fail(claim, RuntimeError("flaky"))
        else:
            queue.complete(claim)
    assert not flaky.active
    assert "3 of its last" in (flaky.reason or "")
    while (claim := queue.claim(good)) is not None:
        queue.complete(claim)
    assert [job.error for job in jobs] == [None] * 6
    assert all(job.remaining == 0 for job in jobs)


def test_quarantine_revokes_claims_in_flight_so_late_results_are_ignored() -> None:
    queue = ConvergingQueue(clock=Clock())
    hung = queue.add_device("hung", budget=1000, rate=1e7)
    other = queue.add_device("other", budget=1000, rate=1e5)
    job = job_of(queue, [10] * 5)
    claim = queue.claim(hung)
    assert claim is not None
    queue.quarantine(hung, "hung")
    assert not queue.holds(claim)
    assert queue.complete(claim) == []  # the late result is dropped
    assert job.remaining == 5
    redo = queue.claim(other)
    assert redo is not None
    queue.complete(redo)
    assert job.remaining == 0


def test_a_device_is_free_after_the_rest_of_its_running_batch_and_all_of_the_next() -> None:
    clock = Clock()
    queue = ConvergingQueue(clock=clock)
    device = queue.add_device("d", budget=100, rate=1000.0, max_inflight=2)
    job_of(queue, [100, 100])
    running, waiting = queue.claim(device), queue.claim(device)
    assert running is not None
    assert waiting is not None
    clock.now = 0.04
    assert device.free_at(clock.now) == pytest.approx(0.2)  # 0.06 s of the first, 0.1 s next
    queue.complete(running, 0.05)  # the next one starts when the first is collected
    assert waiting.started_at == 0.04
