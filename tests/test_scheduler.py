from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedx.batching import End, Item, Job
from embedx.errors import EmbeddingFailed, NoDeviceAvailable
from embedx.scheduler import REGROW_AFTER, Claim, ConvergingQueue, SpeedModel
from embedx.simulation import (
    Arrival,
    FakeDevice,
    oracle_static_split,
    simulate_converging,
    static_split,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def job_of(queue: ConvergingQueue, lengths: list[int]) -> Job:
    job = Job(len(lengths))
    queue.submit(job, [Item(job, i, n) for i, n in enumerate(lengths)])
    return job


def lognormal_lengths(count: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [min(512, max(3, int(rng.lognormvariate(3.4, 0.9)))) for _ in range(count)]


# -- delivery ----------------------------------------------------------------------------


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


# -- devices and sides ---------------------------------------------------------------------


def test_the_faster_half_takes_the_long_end() -> None:
    queue = ConvergingQueue(clock=Clock())
    fast = queue.add_device("fast", budget=1000, rate=1e6)
    slow = queue.add_device("slow", budget=1000, rate=1e4)
    assert queue.end_for(fast) is End.LONG
    assert queue.end_for(slow) is End.SHORT


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


def test_a_device_whose_batches_stray_takes_less_at_the_end() -> None:
    # The end game balances a slow device's last claim against what a fast one drains. A
    # device that ends late holds up everything, one that ends early costs little: so one
    # whose batch times stray plans on the slow side and takes less.
    claimed = {}
    for spread in (0.0, 0.2):
        queue = ConvergingQueue(clock=Clock())
        queue.add_device("fast", budget=100_000, rate=1e6)
        slow = queue.add_device("slow", budget=100_000, rate=2e5)
        slow.speed.spread = spread
        job_of(queue, [100] * 1000)
        claim = queue.claim(slow)
        assert claim is not None
        claimed[spread] = claim.tokens
    assert claimed[0.2] < 0.9 * claimed[0.0]


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


def test_a_host_cpu_that_sits_out_changes_nothing_for_the_gpu() -> None:
    """The host's CPU sits out when its share would be under MIN_HOST_SHARE; the GPU's end
    game counted on it all the same, and cut its last batches small (2.7% slower)."""

    def run(with_cpu: bool) -> tuple[float, list[int]]:
        now = 0.0
        queue = ConvergingQueue(clock=lambda: now)
        specs = {"gpu": (1e6, 0.002, 16384, 2, False)}
        if with_cpu:
            specs["cpu"] = (15000.0, 0.01, 4096, 1, True)
        slots = {}
        for name, (rate, fixed, budget, inflight, host) in specs.items():
            points = [(t, fixed + t / rate) for t in (64, budget, 64, budget)]
            slots[name] = queue.add_device(name, budget=budget, rate=rate, fixed_s=fixed,
                                           max_inflight=inflight, probe=points,
                                           shares_host=host)  # fmt: skip
        job = job_of(queue, lognormal_lengths(3000, seed=1))
        running: list[tuple[float, Claim]] = []
        free = dict.fromkeys(slots, 0.0)
        sizes: list[int] = []
        while job.finished_at is None:
            for name, slot in slots.items():
                while (claim := queue.claim(slot)) is not None:
                    rate, fixed = specs[name][:2]
                    free[name] = max(now, free[name]) + fixed + claim.tokens / rate
                    running.append((free[name], claim))
                    sizes.append(claim.tokens)
            running.sort(key=lambda done: done[0])
            finished_at, done = running.pop(0)
            now = max(now, finished_at)
            rate, fixed = specs[done.device.name][:2]
            queue.complete(done, fixed + done.tokens / rate)
        return job.finished_at, sizes

    alone, with_cpu = run(False), run(True)
    assert with_cpu == alone


def test_while_texts_are_fed_a_gpu_does_not_wait_for_a_faster_host_cpu_that_waits_too() -> None:
    # a GPU slowed by a co-tenant can measure slower than the host's CPU, which waits while
    # the texts are tokenized: the GPU deferred to it, and nobody claimed
    queue = ConvergingQueue(clock=Clock())
    gpu = queue.add_device("gpu", budget=8192, rate=1e5, fixed_s=0.002, max_inflight=2,
                           probe=[(t, 0.002 + t / 1e5) for t in (64, 8192, 64, 8192)])  # fmt: skip
    cpu = queue.add_device("cpu", budget=4096, rate=3e5, fixed_s=0.002, shares_host=True,
                           probe=[(t, 0.002 + t / 3e5) for t in (64, 4096, 64, 4096)])  # fmt: skip
    job = Job(10_000)
    queue.feeding_started(job)
    queue.submit(job, [Item(job, i, 100) for i in range(40)])  # the first chunk
    assert queue.claim(cpu) is None  # the host tokenizes
    assert queue.claim(gpu) is not None


# -- faults ------------------------------------------------------------------------------


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


def test_when_every_device_would_leave_the_rest_to_another_the_fastest_able_claims() -> None:
    """The host's CPU sits out beside GPUs, yet ranks first once out-of-memory failures shrank
    the GPUs' budgets; each GPU, its batch times spread, expects the other to finish sooner.
    With the fallback given to the first ranked, none claimed and the request waited for ever."""
    clock = Clock()
    queue = ConvergingQueue(clock=clock)
    probe = [(64, 0.002 + 64 / 1e7), (4096, 0.002 + 4096 / 1e7)] * 2
    gpus = [
        queue.add_device(name, budget=4096, rate=1e7, fixed_s=0.002, probe=probe)
        for name in ("gpu0", "gpu1")
    ]
    cpu = queue.add_device(
        "cpu", budget=4096, rate=1e5, probe=[(64, 64 / 1e5), (4096, 4096 / 1e5)] * 2,
        shares_host=True,
    )  # fmt: skip
    filler = job_of(queue, [20] * 10_000)
    for gpu in gpus:
        for _ in range(6):  # its budget halves to 64
            claim = queue.claim(gpu)
            assert claim is not None
            queue.fail(claim, MemoryError("injected"), out_of_memory=True)
        for k in range(10):  # and its batches take 0.7 and 1.3 times what was expected
            claim = queue.claim(gpu)
            assert claim is not None
            seconds = claim.expected_s * (0.7 if k % 2 else 1.3)
            clock.now += seconds
            queue.complete(claim, seconds)
    queue.cancel(filler)  # its client left; then a request of one text
    job = job_of(queue, [20])
    assert queue.ranked()[0] is cpu
    claims = [queue.claim(device) for device in (*gpus, cpu)]
    assert [c is not None for c in claims] == [True, False, False]
    assert job.remaining == 1  # claimed, not done


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


# -- the converging claim against static splits (fake devices, simulated time) -----------


@pytest.mark.parametrize("ratio", [1, 2, 5, 9, 20])
@pytest.mark.parametrize("count", [2, 3, 8])
def test_converging_is_near_the_best_static_split_and_never_loses_to_the_fast_device(
    ratio: float, count: int
) -> None:
    lengths = lognormal_lengths(8000, seed=count)
    devices = [
        FakeDevice(f"d{i}", 1e6 / (1 + (ratio - 1) * i / (count - 1)), 0.002, 32768, 2)
        for i in range(count)
    ]
    converging = simulate_converging(devices, [Arrival(0.0, tuple(lengths))])
    oracle, _ = oracle_static_split(devices, lengths)
    alone = static_split(devices[:1], lengths, [1.0])
    assert converging.makespan <= oracle.makespan * 1.03
    assert converging.makespan <= alone.makespan * 1.01
    for name, batches in converging.batches.items():
        if batches:
            assert converging.end_idle(name) <= 0.02 * converging.makespan


@pytest.mark.parametrize("ratio", [2, 5])
def test_a_slow_device_whose_batches_stray_still_never_costs_the_pair(ratio: float) -> None:
    # A GPU time-sliced with co-tenants ran batches 20% over and under the queue's estimate
    # (an H200, BERT-large). With the slow device's batches 25% either way, over seeds: the pair
    # never loses to the fast device alone, and on average keeps within 1% of the static
    # split that is best for the devices' nominal speeds, run with the same draws.
    alone_ratios, static_ratios = [], []
    for seed in range(6):
        lengths = lognormal_lengths(8000, seed)
        devices = [
            FakeDevice("fast", 1e6, 0.002, 65536, 2, jitter=0.05, seed=seed),
            FakeDevice("slow", 1e6 / ratio, 0.002, 65536, 2, jitter=0.25, seed=seed),
        ]
        converging = simulate_converging(devices, [Arrival(0.0, tuple(lengths))])
        nominal = [dataclasses.replace(d, jitter=0.0) for d in devices]
        _, shares = oracle_static_split(nominal, lengths)
        alone_ratios.append(
            converging.makespan / static_split(devices[:1], lengths, [1.0]).makespan
        )
        static_ratios.append(converging.makespan / static_split(devices, lengths, shares).makespan)
    assert max(alone_ratios) < 1.0
    assert sum(static_ratios) / len(static_ratios) <= 1.01


def test_jitter_is_seeded() -> None:
    lengths = tuple(lognormal_lengths(2000))

    def run(seed: int) -> float:
        devices = [FakeDevice("d", 1e5, 0.001, 4096, 1, jitter=0.3, seed=seed)]
        return simulate_converging(devices, [Arrival(0.0, lengths)]).makespan

    assert run(1) == run(1) != run(2)


def test_a_slow_device_sits_out_when_it_would_finish_last() -> None:
    devices = [FakeDevice("fast", 1e6, 0.001, 65536, 2), FakeDevice("slow", 1e3, 0.001, 4096)]
    result = simulate_converging(devices, [Arrival(0.0, tuple([20] * 200))])
    alone = static_split(devices[:1], [20] * 200, [1.0])
    assert result.batches["slow"] == 0
    assert result.makespan <= alone.makespan * 1.001


@pytest.mark.parametrize("feeding", [True, False])
def test_the_end_game_counts_the_texts_still_being_tokenized(feeding: bool) -> None:
    # Two equal devices and the first tenth of a long request queued. Balanced as if it were
    # all the work, it is halved between them; while the rest is still being tokenized, the
    # end is not near and a device takes everything queued (real GPUs, whose feeding ran
    # slower than their claims, were cut down to batches of 11 tokens this way).
    queue = ConvergingQueue(clock=Clock())
    first = queue.add_device("first", budget=10_000, rate=1e6)
    queue.add_device("second", budget=10_000, rate=1e6)
    job = Job(1000 if feeding else 100)
    if feeding:
        queue.feeding_started(job)
    queue.submit(job, [Item(job, i, 10) for i in range(100)])
    claim = queue.claim(first)
    assert claim is not None
    if feeding:
        assert claim.tokens == 1000
        assert queue.unfed_tokens() == pytest.approx(9000)
    else:
        assert claim.tokens <= 600


def test_a_device_on_the_host_cpu_waits_while_texts_are_still_being_tokenized() -> None:
    queue = ConvergingQueue(clock=Clock())
    gpu = queue.add_device("gpu", budget=100, rate=1e7)
    cpu = queue.add_device("cpu", budget=100, rate=1e6, shares_host=True)
    job = job_of(queue, [10] * 50)
    queue.feeding_started(job)
    assert queue.claim(cpu) is None
    assert queue.claim(gpu) is not None
    queue.feeding_done(job)
    assert queue.claim(cpu) is not None


def test_a_host_cpu_too_slow_to_matter_sits_out_until_the_accelerators_are_gone() -> None:
    queue = ConvergingQueue(clock=Clock())
    gpu = queue.add_device("gpu", budget=100, rate=1e7)
    cpu = queue.add_device("cpu", budget=100, rate=1e5, shares_host=True)  # 1% of the work
    job_of(queue, [10] * 50)
    assert queue.claim(cpu) is None
    assert queue.claim(gpu) is not None
    queue.quarantine(gpu, "lost (test)")
    assert queue.claim(cpu) is not None


@pytest.mark.parametrize(
    ("launch_s", "feed_rate"), [(0.0, 3e6), (0.0, 8e6), (0.01, 3.7e6), (0.01, 8e6)]
)
def test_while_texts_arrive_a_slow_device_that_asks_first_leaves_them_to_a_faster_one(
    launch_s: float, feed_rate: float
) -> None:
    # Arriving texts wake every device and any may ask first (the simulator asks in list
    # order: the slow one here). The fast one keeps up with the feed on its own, so the slow
    # one takes next to nothing: each of its batches costs the one host thread a launch.
    # With 10 ms launches (completions and arriving texts wait for them), a queue blind to
    # that cost still gave the slow device batches, and the pair ran slower than the fast
    # device alone.
    rng = random.Random(0)
    lengths = tuple(max(3, min(256, int(rng.lognormvariate(3.6, 0.9)))) for _ in range(40000))
    fast = FakeDevice("fast", 13e6, 0.002, 262144, 2, launch_s=launch_s)
    slow = FakeDevice("slow", 3e6, 0.004, 262144, 2, launch_s=launch_s)
    arrival = [Arrival(0.0, lengths, feed_rate)]
    alone = simulate_converging([fast], arrival)
    pair = simulate_converging([slow, fast], arrival)
    if launch_s:
        assert pair.batches["slow"] == 0
        assert pair.makespan <= 1.001 * alone.makespan
    else:  # the end game may still give it a little
        assert pair.tokens["slow"] <= 0.05 * sum(lengths)
        assert pair.makespan <= 1.01 * alone.makespan
    assert all(count == 1 for count in pair.delivered[0])
    # with everything queued at once, the devices are the limit and the slow one helps
    queued = simulate_converging([slow, fast], [Arrival(0.0, lengths)])
    assert queued.tokens["slow"] >= 0.1 * sum(lengths)
    assert queued.makespan <= 0.92 * simulate_converging([fast], [Arrival(0.0, lengths)]).makespan


def test_texts_fed_slower_than_the_devices_finish_soon_after_the_last_chunk_arrives() -> None:
    # The tokenizer, not the devices, sets the pace: once the last chunk is queued, the two
    # devices share it (plus a few batches' fixed costs), and every text runs once.
    from embedx.models.tokenizer import chunk_bounds

    lengths = tuple([12, 40, 90, 250, 512] * 4000)
    rate, fixed, feed_rate = 9e5, 0.005, 8e5
    devices = [FakeDevice(f"gpu{i}", rate, fixed, 65536, 2) for i in range(2)]
    result = simulate_converging(devices, [Arrival(0.0, lengths, feed_rate)])
    start, stop = chunk_bounds(len(lengths))[-1]
    last_chunk = sum(lengths[start:stop])
    fed_by = sum(lengths) / feed_rate
    assert result.makespan <= fed_by + last_chunk / (2 * rate) + 8 * fixed
    assert all(count == 1 for count in result.delivered[0])
