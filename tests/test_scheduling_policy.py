"""The claim policy: which end a device takes, how much near the end, and when it sits out."""

from __future__ import annotations

import pytest

from embedx.scheduling import Claim, ConvergingQueue, DeviceView, End, Item, Job, QueueView, policy
from tests.support.queues import Clock, job_of, lognormal_lengths


def device(
    name: str,
    *,
    rate: float,
    budget: int,
    fixed: float = 0.0,
    spread: float = 0.0,
    known: bool = True,
    shares_host: bool = False,
    free_at: float = 0.0,
    holding: int = 0,
) -> DeviceView:
    """A device as the policy sees it, idle at time 0 unless told otherwise."""
    return DeviceView(
        name, budget, rate, fixed, spread, known, 0.0, shares_host, free_at, holding
    )  # fmt: skip


def seen(
    *devices: DeviceView, pending: int, length: int = 10, unfed: float = 0.0, feeding: int = 0
) -> QueueView:
    """The queue at time 0, its pending texts all `length` tokens long."""
    return QueueView(0.0, devices, pending, unfed, feeding, length, length)


# -- the policy alone, on views built by hand ---------------------------------------------


def test_a_slow_device_sits_out_when_it_would_finish_after_the_fast_one_drains_everything() -> None:
    fast = device("fast", rate=1e6, budget=65536, fixed=0.001)
    slow = device("slow", rate=1e3, budget=4096, fixed=0.001)
    view = seen(fast, slow, pending=4000, length=20)
    assert policy.tail_target(view, slow, End.SHORT) is None
    assert policy.tail_target(view, fast, End.LONG) == 4000  # all of it


def test_near_the_end_a_device_takes_its_share_of_what_is_left() -> None:
    first = device("first", rate=1e6, budget=10_000)
    second = device("second", rate=1e6, budget=10_000)
    target = policy.tail_target(seen(first, second, pending=1000), first, End.LONG)
    assert target is not None
    assert 400 <= target <= 600


def test_texts_still_being_tokenized_keep_the_end_game_away() -> None:
    first = device("first", rate=1e6, budget=10_000)
    second = device("second", rate=1e6, budget=10_000)
    view = seen(first, second, pending=1000, unfed=9000, feeding=1)
    # half of all the work, queued or still to come: more than the 1000 tokens queued
    assert policy.tail_target(view, first, End.LONG) == 5000


def test_when_taking_the_last_item_or_leaving_it_end_the_work_alike_the_device_takes_it() -> None:
    """Ties go to the larger claim. The other device holds a claim, so this is not the
    fallback that lets the first device make progress when nobody works."""
    me = device("me", rate=1000.0, budget=1000)
    twin = device("twin", rate=1000.0, budget=1000, holding=1)
    assert policy.tail_target(seen(me, twin, pending=1000, length=1000), me, End.LONG) == 1000
    quicker = device("quicker", rate=1001.0, budget=1000, holding=1)
    assert policy.tail_target(seen(me, quicker, pending=1000, length=1000), me, End.LONG) is None


def test_a_device_not_yet_measured_takes_a_small_first_batch_from_the_short_end() -> None:
    guessed = device("guessed", rate=1e9, budget=1600, known=False)
    measured = device("measured", rate=1e3, budget=1600)
    view = seen(guessed, measured, pending=100_000)
    assert policy.end_for(view, guessed) is End.SHORT
    assert policy.tail_target(view, guessed, End.SHORT) == 100


def test_the_faster_half_of_three_devices_takes_the_long_end() -> None:
    devices = [device(f"d{i}", rate=rate, budget=1000) for i, rate in enumerate((3e5, 1e6, 1e4))]
    view = seen(*devices, pending=100_000)
    assert [policy.end_for(view, d) for d in devices] == [End.LONG, End.LONG, End.SHORT]


def test_a_host_device_sits_out_below_its_share_and_works_alone() -> None:
    gpu = device("gpu", rate=1e7, budget=100)
    slow_cpu = device("cpu", rate=1e5, budget=100, shares_host=True)  # 1% of the work
    quick_cpu = device("cpu", rate=3e5, budget=100, shares_host=True)  # 3%
    assert policy.host_sits_out(seen(gpu, slow_cpu, pending=1000), slow_cpu)
    assert not policy.host_sits_out(seen(gpu, quick_cpu, pending=1000), quick_cpu)
    assert not policy.host_sits_out(seen(slow_cpu, pending=1000), slow_cpu)
    assert not policy.host_sits_out(seen(gpu, slow_cpu, pending=1000), gpu)


def test_a_host_device_waits_while_texts_are_tokenized_unless_it_is_alone() -> None:
    gpu = device("gpu", rate=1e5, budget=100)
    cpu = device("cpu", rate=1e6, budget=100, shares_host=True)  # faster, yet it waits
    assert policy.host_waits(seen(gpu, cpu, pending=1000, feeding=1), cpu)
    assert not policy.host_waits(seen(gpu, cpu, pending=1000), cpu)
    assert not policy.host_waits(seen(cpu, pending=1000, feeding=1), cpu)
    assert not policy.host_waits(seen(gpu, cpu, pending=1000, feeding=1), gpu)


def test_when_nobody_works_the_fastest_device_that_does_not_sit_out_goes_first() -> None:
    # the host's CPU ranks first by its rate at its full budget beside a GPU whose budget
    # shrank, but it leaves the work to the GPU
    cpu = device("cpu", rate=1e5, budget=4096, shares_host=True)
    gpu = device("gpu", rate=1e7, budget=64, fixed=0.002)
    view = seen(cpu, gpu, pending=20)
    assert policy.ranked(view) == [cpu, gpu]
    assert policy.first_to_progress(view) is gpu


def test_while_texts_arrive_a_slow_device_leaves_them_to_a_faster_one_that_drains_them_first() -> (
    None
):
    fast = device("fast", rate=1e6, budget=10_000)
    slow = device("slow", rate=1e5, budget=10_000)
    feeding = seen(fast, slow, pending=5000, feeding=1)
    assert policy.better_left_to_faster(feeding, slow)
    assert not policy.better_left_to_faster(feeding, fast)
    assert not policy.better_left_to_faster(seen(fast, slow, pending=5000), slow)


def test_a_device_whose_batches_stray_plans_its_finish_on_the_slow_side() -> None:
    steady = device("steady", rate=1000.0, budget=1000, free_at=1.0)
    straying = device("straying", rate=1000.0, budget=1000, spread=0.25, free_at=1.0)
    view = seen(steady, straying, pending=1000)
    assert policy.finish_at(view, steady, 1000) == 2.0  # a second held, then a second
    assert policy.finish_at(view, straying, 1000) == 2.5


def test_devices_not_yet_measured_are_not_counted_on_to_drain_the_work() -> None:
    measured = device("measured", rate=1000.0, budget=1000)
    guessed = device("guessed", rate=1e9, budget=1000, known=False)
    view = seen(measured, guessed, pending=1000)
    assert policy.drain_time(view, [measured, guessed], 1000) == 1.0
    assert policy.drain_time(view, [guessed], 1000) < 0.001  # none measured: the guess it is


# -- the policy as the queue applies it ----------------------------------------------------


def test_the_faster_half_takes_the_long_end() -> None:
    queue = ConvergingQueue(clock=Clock())
    fast = queue.add_device("fast", budget=1000, rate=1e6)
    slow = queue.add_device("slow", budget=1000, rate=1e4)
    assert policy.end_for(*queue.view(fast)) is End.LONG
    assert policy.end_for(*queue.view(slow)) is End.SHORT


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
    view, _ = queue.view(cpu)
    assert policy.ranked(view)[0].name == "cpu"
    claims = [queue.claim(device) for device in (*gpus, cpu)]
    assert [c is not None for c in claims] == [True, False, False]
    assert job.remaining == 1  # claimed, not done


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


def test_a_device_busy_with_a_batch_lets_a_few_short_texts_gather_for_one_launch() -> None:
    queue = ConvergingQueue(clock=Clock())
    # runs 20 tokens in 2 us, while a launch holds the host for 500 us
    gpu = queue.add_device("gpu", budget=4096, rate=1e7, max_inflight=2, launch_s=500e-6)
    first = job_of(queue, [20])
    alone = queue.claim(gpu)
    assert alone is not None
    assert len(alone.items) == 1
    for _ in range(5):  # five more arrive while it runs
        job_of(queue, [20])
    assert queue.claim(gpu) is None  # launched now, they would be one text a launch
    queue.complete(alone)
    assert first.remaining == 0
    gathered = queue.claim(gpu)
    assert gathered is not None
    assert len(gathered.items) == 5


def test_a_device_busy_with_a_batch_launches_the_next_when_it_outlasts_a_launch() -> None:
    queue = ConvergingQueue(clock=Clock())
    gpu = queue.add_device("gpu", budget=16384, rate=1e7, max_inflight=2, launch_s=500e-6)
    job_of(queue, [20])
    assert queue.claim(gpu) is not None
    job_of(queue, [400] * 10)  # 400 us of the device's time: near a launch's 500 us
    assert queue.claim(gpu) is None
    job_of(queue, [400] * 10)  # 800 us: launched now, it runs while the first is collected
    second = queue.claim(gpu)
    assert second is not None
    assert second.tokens == 8000
