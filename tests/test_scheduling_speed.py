"""SpeedModel: a device's batch time fitted from the batches it ran, outliers capped."""

from __future__ import annotations

import random

import pytest

from embedx.scheduling import Claim, ConvergingQueue, SpeedModel
from tests.support.queues import job_of


def test_speed_model_learns_fixed_cost_and_rate() -> None:
    model = SpeedModel(rate=1.0)
    for tokens in (1000, 4000, 16000, 2000, 8000):
        model.observe(tokens, 0.003 + tokens / 250_000)
    assert model.rate == pytest.approx(250_000, rel=1e-6)
    assert model.fixed == pytest.approx(0.003, rel=1e-6)


def test_speed_model_spread_is_how_far_batch_times_stray_from_the_fit() -> None:
    steady, straying = SpeedModel(rate=250_000, fixed=0.003), SpeedModel(rate=250_000, fixed=0.003)
    for i, tokens in enumerate((1000, 4000, 16000, 2000, 8000) * 4):
        exact = 0.003 + tokens / 250_000
        steady.observe(tokens, exact)
        straying.observe(tokens, exact * (1.2 if i % 2 else 0.8))
    assert steady.spread == pytest.approx(0.0, abs=1e-9)
    assert 0.1 < straying.spread < 0.3


def test_one_batch_far_slower_than_its_device_does_not_keep_that_device_idle() -> None:
    """A pause (a kernel's first run, a collection) makes one batch 50 times as slow. Counted
    in full, the device looked so slow that it was never again given the batches that would
    correct its fit: under light load its twin did everything."""
    rate, fixed, budget = 1e6, 0.002, 8192

    def true_s(tokens: int) -> float:
        return fixed + tokens / rate

    now = 0.0
    queue = ConvergingQueue(clock=lambda: now)
    probe = [(t, true_s(t)) for t in (64, budget, 64, budget)]
    twins = [queue.add_device(name, budget=budget, rate=rate, fixed_s=fixed, max_inflight=1,
                              probe=probe) for name in ("d0", "d1")]  # fmt: skip
    for _ in range(3):  # a few batches as expected, then the pause
        twins[1].speed.observe(2000, true_s(2000))
    twins[1].speed.observe(2000, 50 * true_s(2000))
    rng = random.Random(0)
    batches = {"d0": 0, "d1": 0}
    for request in range(100):  # light load: one request of about 1.3 budgets at a time
        now = max(now, request * 0.1)
        job = job_of(queue, [rng.randint(20, 300) for _ in range(80)])
        running: list[tuple[float, Claim]] = []
        free = dict.fromkeys(batches, now)
        while job.finished_at is None:
            for device in rng.sample(twins, 2):  # whichever worker wakes first
                while (claim := queue.claim(device)) is not None:
                    batches[device.name] += 1
                    free[device.name] = max(now, free[device.name]) + true_s(claim.tokens)
                    running.append((free[device.name], claim))
            running.sort(key=lambda done: done[0])
            finished_at, done = running.pop(0)
            now = max(now, finished_at)
            queue.complete(done, true_s(done.tokens))
    assert batches["d1"] > 0.3 * sum(batches.values()), batches
