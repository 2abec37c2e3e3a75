"""Deterministic discrete-event simulation of devices with set speeds claiming from the real queue.

A fake device runs a batch in `fixed_s + padded_tokens / rate` seconds of simulated time,
times a seeded random factor if it has jitter. The converging policy is the real
ConvergingQueue on a simulated clock; the static policies it is compared with split the
items up front and never rebalance.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from embedx.models.chunks import chunk_bounds
from embedx.scheduling import ConvergingQueue, Cut, End, Item, Job, LengthBuckets

# Characters a simulated token stands for, where the tokenizer's chunks are cut.
CHARS_A_TOKEN = 4


@dataclass(frozen=True, slots=True)
class FakeDevice:
    name: str
    rate: float  # tokens per second
    fixed_s: float  # cost of any batch, however small
    budget: int  # padded tokens per batch
    max_inflight: int = 1
    # What the queue is told before it measures anything. None: the truth, as a load-time
    # probe would measure it; a number: a static score in tokens/s, with no fixed cost known.
    score: float | None = None

    padded: bool = False  # pays for count * longest (a padded model), else for real tokens
    # Host seconds a launch takes. Every device launches on the same host thread, one
    # launch at a time, and a batch starts on its device once launched.
    launch_s: float = 0.0
    # Each batch takes its nominal time times a factor drawn evenly from [1 - jitter,
    # 1 + jitter]: a GPU time-sliced with a co-tenant ran batches 20% over and under the
    # queue's estimate (an H200, BERT-large). The draws are seeded by `seed` and the name.
    jitter: float = 0.0
    seed: int = 0

    def seconds(self, tokens: int, area: int) -> float:
        return self.fixed_s + (area if self.padded else tokens) / self.rate

    def timer(self) -> Callable[[int, int], float]:
        """A batch's seconds, jitter drawn afresh for each call (the same sequence each run)."""
        if not self.jitter:
            return self.seconds
        draws = random.Random(f"{self.name}:{self.seed}")

        def seconds(tokens: int, area: int) -> float:
            return self.seconds(tokens, area) * draws.uniform(1 - self.jitter, 1 + self.jitter)

        return seconds


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    lengths: tuple[int, ...]
    # None: every item is queued at `at`. Else tokens/s at which the tokenizer queues them,
    # in the engine's chunks, the queue told that feeding goes on until the last one.
    feed_rate: float | None = None


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Items start:stop of a fed job, queued when the tokenizer would have them."""

    job: Job
    start: int
    stop: int
    lengths: tuple[int, ...]


@dataclass(slots=True)
class SimResult:
    makespan: float
    busy_s: dict[str, float]
    last_finish: dict[str, float]
    tokens: dict[str, int]
    batches: dict[str, int]
    # per job: (arrival time, finish time); per item: seconds from arrival to its claim
    job_times: list[tuple[float, float]] = field(default_factory=list)
    item_waits: list[float] = field(default_factory=list)
    delivered: list[list[int]] = field(default_factory=list)  # per job, how often each index ran

    def end_idle(self, name: str) -> float:
        """Seconds between a device's last batch and the end of all work."""
        return self.makespan - self.last_finish.get(name, 0.0)


def simulate_converging(
    devices: Sequence[FakeDevice],
    arrivals: Sequence[Arrival],
    *,
    max_batch_items: int | None = None,
) -> SimResult:
    """Run the arrivals through a ConvergingQueue shared by `devices`."""
    now = 0.0
    queue = ConvergingQueue(clock=lambda: now, max_batch_items=max_batch_items)
    slots = {
        d.name: queue.add_device(
            d.name,
            budget=d.budget,
            rate=d.rate if d.score is None else d.score,
            fixed_s=d.fixed_s if d.score is None else 0.0,
            max_inflight=d.max_inflight,
            measured=d.score is None,
            probe=_probe(d) if d.score is None else (),
            launch_s=d.launch_s if d.score is None else 0.0,
        )
        for d in devices
    }
    by_name = {d.name: d for d in devices}
    timers = {d.name: d.timer() for d in devices}
    took: dict[int, float] = {}  # claim id -> the seconds its batch runs
    result = _empty_result(devices)
    events: list[tuple[float, int, str, object]] = []
    order = itertools.count()
    free_at = dict.fromkeys(slots, 0.0)
    jobs: list[Job] = []

    for arrival in arrivals:
        heapq.heappush(events, (arrival.at, next(order), "arrive", arrival))

    def dispatch() -> None:
        nonlocal now
        for name, slot in slots.items():
            while True:
                claim = queue.claim(slot)
                if claim is None:
                    break
                device = by_name[name]
                now += device.launch_s  # the host thread launches it, seeing nothing else
                slot.observe_launch(device.launch_s)
                start = max(now, free_at[name])
                took[claim.id] = timers[name](claim.tokens, claim.area)
                finish = start + took[claim.id]
                free_at[name] = finish
                for item in claim.items:
                    result.item_waits.append(now - item.enqueued_at)
                heapq.heappush(events, (finish, next(order), "finish", claim))

    def arrive(arrival: Arrival) -> None:
        job = Job(len(arrival.lengths))
        job.submitted_at = now
        job.out = [0] * len(arrival.lengths)
        jobs.append(job)
        if arrival.feed_rate is None:
            queue.submit(job, [Item(job, i, n) for i, n in enumerate(arrival.lengths)])
            return
        queue.feeding_started(job)
        fed = 0
        for start, stop in chunk_bounds(CHARS_A_TOKEN * n for n in arrival.lengths):
            fed += sum(arrival.lengths[start:stop])
            chunk = _Chunk(job, start, stop, arrival.lengths)
            heapq.heappush(events, (now + fed / arrival.feed_rate, next(order), "chunk", chunk))

    while events:
        due, _, kind, payload = heapq.heappop(events)
        now = max(now, due)  # what fell due while the host thread was launching waits for it
        if kind == "arrive":
            assert isinstance(payload, Arrival)
            arrive(payload)
        elif isinstance(payload, _Chunk):
            chunk, lengths = payload, payload.lengths
            items = [Item(chunk.job, i, lengths[i]) for i in range(chunk.start, chunk.stop)]
            queue.submit(chunk.job, items)
            if chunk.stop == len(lengths):
                queue.feeding_done(chunk.job)
        else:
            claim = payload
            name = claim.device.name  # type: ignore[attr-defined]
            for item in claim.items:  # type: ignore[attr-defined]
                item.job.out[item.index] += 1
            seconds = took.pop(claim.id)  # type: ignore[attr-defined]
            queue.complete(claim, seconds)  # type: ignore[arg-type]
            result.busy_s[name] += seconds
            result.tokens[name] += claim.tokens  # type: ignore[attr-defined]
            result.batches[name] += 1
            result.last_finish[name] = now
        dispatch()

    result.makespan = max(result.last_finish.values(), default=0.0)
    for job in jobs:
        assert job.finished_at is not None, "a job never finished: this is a bug"
        result.job_times.append((job.submitted_at, job.finished_at))
        result.delivered.append(job.out)
    return result


def static_split(
    devices: Sequence[FakeDevice], lengths: Sequence[int], shares: Sequence[float]
) -> SimResult:
    """Split one job up front, device i getting `shares[i]` of the tokens, and run it.

    The items are sorted and cut into contiguous length ranges, the first device getting the
    longest, so each part pads as little as the converging queue's batches do; each device
    then cuts its part into budget batches.
    """
    return _LongestFirst(lengths).split(devices, shares)


def split_by_tokens(lengths: Sequence[int], shares: Sequence[float]) -> list[list[int]]:
    """Indices of the items, longest first, cut into contiguous parts holding `shares` of
    the tokens: part i gets about shares[i] / sum(shares) of them."""
    items = _LongestFirst(lengths)
    return [items.order[start:stop] for start, stop in items.parts(shares)]


class _LongestFirst:
    """One job's items sorted longest first, sorted and made once for every split a search
    tries (the oracle's runs hundreds)."""

    def __init__(self, lengths: Sequence[int]) -> None:
        self.order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        ordered = [lengths[i] for i in self.order]
        self.total = sum(ordered)
        # Where each item's tokens are centred, counted from the longest: an item goes to the
        # part whose bound it does not pass.
        self.centres = np.cumsum([0, *ordered[:-1]], dtype=np.float64) + np.divide(ordered, 2)
        job = Job(len(ordered))  # never cancelled: its items are only cut
        self.items = [Item(job, i, n) for i, n in enumerate(ordered)]

    def parts(self, shares: Sequence[float]) -> list[tuple[int, int]]:
        """Each part's start and stop in the sorted order: part i holds the items whose
        centre lies within the first shares[:i + 1] of the tokens."""
        total_share, bound, stops = sum(shares), 0.0, []
        for share in shares[:-1]:
            bound += self.total * share / total_share
            stops.append(int(np.searchsorted(self.centres, bound, side="right")))
        stops.append(len(self.items))
        return list(zip([0, *stops[:-1]], stops, strict=True))

    def split(self, devices: Sequence[FakeDevice], shares: Sequence[float]) -> SimResult:
        result = _empty_result(devices)
        for device, (start, stop) in zip(devices, self.parts(shares), strict=True):
            buckets = LengthBuckets()
            buckets.push_all(self.items[start:stop])
            clock = 0.0
            seconds = device.timer()
            while buckets.count:
                cut = Cut(device.budget, device.budget)
                buckets.cut(End.LONG, cut)
                clock += seconds(cut.tokens, cut.area)
                result.tokens[device.name] += cut.tokens
                result.batches[device.name] += 1
            result.busy_s[device.name] = clock
            result.last_finish[device.name] = clock
        result.makespan = max(result.last_finish.values())
        return result


def oracle_static_split(
    devices: Sequence[FakeDevice], lengths: Sequence[int], steps: int = 40
) -> tuple[SimResult, list[float]]:
    """The best fixed split found in hindsight: coordinate search over the shares."""
    items = _LongestFirst(lengths)
    shares = [d.rate for d in devices]
    best = items.split(devices, shares)
    step = 0.5
    for _ in range(steps):
        improved = False
        for i in range(len(devices)):
            for factor in (1 + step, 1 / (1 + step)):
                trial = list(shares)
                trial[i] *= factor
                result = items.split(devices, trial)
                if result.makespan < best.makespan - 1e-12:
                    best, shares, improved = result, trial, True
        if not improved:
            step /= 2
            if step < 1e-3:
                break
    return best, shares


def _probe(device: FakeDevice) -> list[tuple[float, float]]:
    """The (tokens, seconds) points a load-time probe measures, as the engine's does: a small
    and a full batch, twice, at the device's nominal speed."""
    small = min(64, device.budget)
    return [(t, device.seconds(t, t)) for t in (small, device.budget, small, device.budget)]


def _empty_result(devices: Sequence[FakeDevice]) -> SimResult:
    names = [d.name for d in devices]
    return SimResult(
        makespan=0.0,
        busy_s=dict.fromkeys(names, 0.0),
        last_finish=dict.fromkeys(names, 0.0),
        tokens=dict.fromkeys(names, 0),
        batches=dict.fromkeys(names, 0),
    )
