"""ConvergingQueue: the one owner of pending work, from which devices claim batches at either end.

Fast devices take the LONG end of the length order and slow ones the SHORT end, so the two
frontiers meet wherever the devices' measured speeds put them; no ratio is configured.
Items carry a generation: a claim serves the oldest generation first, so a request never
starves behind newcomers. Near the end of the work a claim is sized so that the device
finishes no later than the others would finish everything left without it; a device that
cannot help sits out. Failures put work back: nothing a caller submitted is lost.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from embedx.batching import Cut, End, Item, Job, LengthBuckets
from embedx.errors import EmbeddingFailed, NoDeviceAvailable, ShuttingDown
from embedx.telemetry import LATENCY_BUCKETS_S, Histogram

log = logging.getLogger("embedx.scheduler")

# A device is taken out once this many of its last QUARANTINE_WINDOW batches failed: not
# only in a row, or one that fails two batches of three, succeeding in between, would keep
# failing the items it takes back (each failure counts against them) and never be taken out.
QUARANTINE_AFTER_FAILURES = 3
QUARANTINE_WINDOW = 5
MAX_ITEM_ATTEMPTS = 4  # failed batches an item may be part of before its job fails
# A host-CPU device beside accelerators works only if it could do this share of the work.
MIN_HOST_SHARE = 0.02


class SpeedModel:
    """Batch time as `fixed + tokens / rate`, fitted by exponentially weighted least squares.

    Tokens are real tokens: what padding costs a padded model shows up in its rate.

    Until two different batch sizes have been seen, the rate comes from the prior (a static
    score or a probe measurement) and the fixed cost from the prior fixed cost.
    """

    __slots__ = (
        "_sw",
        "_sx",
        "_sxx",
        "_sxy",
        "_sy",
        "fixed",
        "measured",
        "rate",
        "samples",
        "spread",
    )
    DECAY = 0.85  # weight of older batches: about the last seven dominate

    def __init__(
        self,
        rate: float,
        fixed: float = 0.0,
        *,
        measured: bool = True,
        points: Sequence[tuple[float, float]] = (),
    ) -> None:
        self.rate = rate
        self.fixed = fixed
        self.measured = measured  # the prior was measured (a probe), not a static score
        self.samples = 0
        self._sw = self._sx = self._sy = self._sxx = self._sxy = 0.0
        # How far a batch's time strays from the fit, as a share of it (a moving average):
        # a GPU time-sliced with a co-tenant ran batches 20% over and under (an H200, BERT-large).
        self.spread = 0.0
        # A probe's (tokens, seconds) points seed the fit, so one tiny batch later (a smoke
        # test) cannot pass for the device's speed.
        for tokens, seconds in points:
            self.observe(tokens, seconds)
        self.samples = 0
        self.spread = 0.0  # the probe's first points stray from a fit not yet made

    def seconds(self, tokens: float) -> float:
        return self.fixed + tokens / self.rate

    def effective_rate(self, batch_tokens: float) -> float:
        """Tokens/s sustained with batches of `batch_tokens`, the fixed cost included."""
        return batch_tokens / self.seconds(batch_tokens)

    def observe(self, tokens: float, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        d = self.DECAY
        expected = self.seconds(tokens)
        if self.samples >= 3:
            # One batch far off the fit (a pause, a kernel's first run) counts as a few times
            # off, no more: else the device looks so slow it is not given the batches that
            # would correct the fit. A device that really slowed down still gets there, a few
            # times slower a batch.
            seconds = min(seconds, OUTLIER_FACTOR * expected)
        self.spread = d * self.spread + (1 - d) * abs(seconds - expected) / expected
        self._sw = d * self._sw + 1.0
        self._sx = d * self._sx + tokens
        self._sy = d * self._sy + seconds
        self._sxx = d * self._sxx + tokens * tokens
        self._sxy = d * self._sxy + tokens * seconds
        self.samples += 1
        mean_x, mean_y = self._sx / self._sw, self._sy / self._sw
        var_x = self._sxx / self._sw - mean_x * mean_x
        cov = self._sxy / self._sw - mean_x * mean_y
        if var_x > (0.05 * mean_x) ** 2 and cov > 0:
            per_token = cov / var_x
            fixed = mean_y - per_token * mean_x
            if fixed >= 0:
                self.rate, self.fixed = 1.0 / per_token, fixed
                return
        # One size seen (or a noisy fit): keep the fixed cost, explain the rest by the rate.
        fixed = min(self.fixed, 0.5 * mean_y)
        self.fixed = fixed
        self.rate = mean_x / (mean_y - fixed)


OUTLIER_FACTOR = 3.0  # the most a batch's time counts against the fit's expectation
# Batches a device finishes at a budget halved by running out of memory before it doubles
# again (up to the one it was given): another model loading beside it, say, has passed.
REGROW_AFTER = 32


class DeviceState(enum.Enum):
    ACTIVE = "active"
    QUARANTINED = "quarantined"


@dataclass(slots=True, eq=False)
class DeviceSlot:
    """The queue's view of one device: its budget, its speed, its claims in flight."""

    name: str
    budget: int
    max_inflight: int
    speed: SpeedModel
    state: DeviceState = DeviceState.ACTIVE
    reason: str | None = None
    inflight: list[Claim] = field(default_factory=list)
    outcomes: deque[bool] = field(default_factory=lambda: deque(maxlen=QUARANTINE_WINDOW))
    tokens_done: int = 0
    batches_done: int = 0
    busy_s: float = 0.0
    shares_host: bool = False  # computes on the host CPU that tokenization also needs
    last_done_at: float | None = None  # the queue clock when its last batch finished
    # Seconds a launch holds the host's one event-loop thread, which every device's launches
    # and the tokenizer's hand-offs share: device time alone misses it (see `_tail_target`).
    launch_s: float = 0.0
    # All launches' seconds: under load a launch also waits for the interpreter lock at each
    # of its torch calls, so this share of the loop's time shows how contended the host is.
    launching_s: float = 0.0
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    full_budget: int = 0  # the budget it was given; out of memory halves `budget` for a while
    clean_batches: int = 0  # finished since `budget` last changed, while below `full_budget`

    def __post_init__(self) -> None:
        self.full_budget = self.full_budget or self.budget

    @property
    def active(self) -> bool:
        return self.state is DeviceState.ACTIVE

    def observe_launch(self, seconds: float) -> None:
        """Record what launching one batch cost the host (a moving average)."""
        self.launch_s = 0.8 * self.launch_s + 0.2 * seconds if self.launch_s else seconds
        self.launching_s += seconds

    def effective_rate(self) -> float:
        return self.speed.effective_rate(self.budget)


@dataclass(slots=True, eq=False)
class Claim:
    """A batch a device took: the items, their padded area, and when it started running."""

    id: int
    device: DeviceSlot
    items: list[Item]
    tokens: int
    longest: int
    claimed_at: float
    expected_s: float
    started_at: float | None = None

    @property
    def area(self) -> int:
        """Padded tokens: what a padded batch of these items costs."""
        return len(self.items) * self.longest


class ConvergingQueue:
    """Pending items of every in-flight job of one model, claimed by that model's devices."""

    def __init__(
        self,
        *,
        name: str = "",
        clock: Callable[[], float] = time.monotonic,
        max_batch_items: int | None = None,
        quarantine_after: int = QUARANTINE_AFTER_FAILURES,
        max_item_attempts: int = MAX_ITEM_ATTEMPTS,
    ) -> None:
        self.name = name  # the model's, for the log
        self.clock = clock
        self.max_batch_items = max_batch_items
        self.quarantine_after = quarantine_after
        self.max_item_attempts = max_item_attempts
        self.devices: list[DeviceSlot] = []
        self._generations: dict[int, LengthBuckets] = {}
        self._open_generation = 0
        self._claim_ids = itertools.count()
        self.pending_items = 0
        self.pending_tokens = 0
        self.padding_tokens = 0
        self.queue_wait = Histogram(LATENCY_BUCKETS_S)
        self.closed = False
        self._feeding: dict[int, Job] = {}  # jobs still being tokenized and submitted

    # -- devices -------------------------------------------------------------------------

    def add_device(
        self,
        name: str,
        *,
        budget: int,
        rate: float,
        fixed_s: float = 0.0,
        max_inflight: int = 1,
        measured: bool = True,
        probe: Sequence[tuple[float, float]] = (),
        launch_s: float = 0.0,
        shares_host: bool = False,
    ) -> DeviceSlot:
        """Register a device. `rate` and `fixed_s` are the prior speed: a load-time probe
        (`measured`, with its (tokens, seconds) points) or a static score, which others do
        not count on until the device is measured. `launch_s` is the host's cost of a
        launch, as far as it is known."""
        speed = SpeedModel(rate, fixed_s, measured=measured, points=probe)
        slot = DeviceSlot(
            name, max(1, budget), max_inflight, speed, shares_host=shares_host, launch_s=launch_s
        )
        self.devices.append(slot)
        return slot

    def active_devices(self) -> list[DeviceSlot]:
        return [d for d in self.devices if d.active]

    def _active_accelerators(self) -> list[DeviceSlot]:
        """The active devices that do not compute on the host's CPU."""
        return [d for d in self.devices if d.active and not d.shares_host]

    def ranked(self) -> list[DeviceSlot]:
        """Active devices, fastest first by measured (or prior) tokens/s."""
        return sorted(self.active_devices(), key=lambda d: -d.effective_rate())

    def end_for(self, device: DeviceSlot) -> End:
        """The faster half of the devices takes the LONG end, the rest the SHORT end.
        A device not yet measured takes the SHORT end: its first item should be cheap."""
        if not device.speed.measured and not device.speed.samples:
            return End.SHORT
        ranked = self.ranked()
        if device not in ranked:
            return End.SHORT
        return End.LONG if ranked.index(device) < len(ranked) / 2 else End.SHORT

    # -- submitting and cancelling -------------------------------------------------------

    def submit(self, job: Job, items: Sequence[Item]) -> None:
        """Add a job's items (all or a chunk of them) to the open generation."""
        if self.closed:
            raise ShuttingDown("the model is unloading; send the request again")
        if not self.active_devices():
            raise NoDeviceAvailable("every device of this model is quarantined")
        if job.cancelled:  # it failed or was cancelled while these texts were tokenized
            return
        now = self.clock()
        generation = self._open_generation
        buckets = self._generations.get(generation)
        if buckets is None:
            buckets = self._generations[generation] = LengthBuckets()
        tokens = 0
        for item in items:
            item.generation = generation
            item.enqueued_at = now
            tokens += item.length
            buckets.push(item)
        job.tokens += tokens
        job.fed += len(items)
        job.pending_items += len(items)
        job.pending_tokens += tokens
        self.pending_items += len(items)
        self.pending_tokens += tokens
        self._wake_all()

    def feeding_started(self, job: Job) -> None:
        """The job's texts will be submitted chunk by chunk until `feeding_done`."""
        self._feeding[id(job)] = job

    def feeding_done(self, job: Job) -> None:
        self._feeding.pop(id(job), None)
        self._wake_all()

    @property
    def feeding(self) -> int:
        """Jobs still being tokenized and submitted."""
        return len(self._feeding)

    def unfed_tokens(self) -> float:
        """An estimate of the tokens still to be submitted: each feeding job's texts not yet
        queued, at the mean length of those it queued."""
        total = 0.0
        for job in self._feeding.values():
            if job.fed and not job.cancelled:
                total += (job.size - job.fed) * job.tokens / job.fed
        return total

    def cancel(self, job: Job) -> None:
        """Drop a job's pending items: skipped when a claim reaches them, or all let go at once
        when no live item is left (no claim would reach them then)."""
        if job.cancelled:
            return
        job.cancelled = True
        job.out = None  # its rows are read by no one: not kept while its items wait to be swept
        self._forget_pending(job)

    def _forget_pending(self, job: Job) -> None:
        self.pending_items -= job.pending_items
        self.pending_tokens -= job.pending_tokens
        job.pending_items = job.pending_tokens = 0
        if self.pending_items == 0:  # what the buckets hold is dead, with its token ids
            self._generations.clear()

    # -- claiming ------------------------------------------------------------------------

    def claim(self, device: DeviceSlot) -> Claim | None:
        """Take the next batch for `device`, or None if it has nothing useful to do now."""
        if not device.active or len(device.inflight) >= device.max_inflight:
            return None
        if self.pending_items <= 0:
            return None
        if device.shares_host and self._host_better_left_to_feeding(device):
            return None
        if self._better_left_to_faster(device):
            return None
        end = self.end_for(device)
        target = self._tail_target(device, end)
        if target is None:
            return None
        cut = Cut(device.budget, target, self.max_batch_items)
        for generation in sorted(self._generations):
            buckets = self._generations[generation]
            buckets.cut(end, cut)
            if buckets.count == 0:
                del self._generations[generation]
            if generation == self._open_generation:
                self._open_generation += 1  # newcomers form the next generation
            if buckets.count:
                break  # the cut stopped short of this generation's end: the batch is full
        if not cut.items:
            return None
        now = self.clock()
        oldest = now
        for item in cut.items:
            job = item.job
            job.pending_items -= 1
            job.pending_tokens -= item.length
            oldest = min(oldest, item.enqueued_at)
        self.queue_wait.observe(now - oldest)  # per batch: its longest-waiting item
        self.pending_items -= len(cut.items)
        self.pending_tokens -= cut.tokens
        claim = Claim(
            next(self._claim_ids),
            device,
            cut.items,
            cut.tokens,
            cut.longest,
            now,
            device.speed.seconds(cut.tokens),
            started_at=None if device.inflight else now,
        )
        device.inflight.append(claim)
        self.padding_tokens += claim.area - claim.tokens
        return claim

    def _tail_target(self, device: DeviceSlot, end: End) -> int | None:
        """The real tokens to claim: up to the device's budget or, near the end of the work,
        the share it can finish before the other devices would finish everything else.
        None when the device would finish even one item after the others finish it all."""
        budget = device.budget
        if not device.speed.measured and not device.speed.samples:
            # A small first batch from the short end measures a device whose speed is only
            # a guess; counting its fixed cost as rate errs on the slow, safe side.
            return max(1, budget // 16)
        # not a host device that sits out: counting on it to drain the rest would cut this
        # device's last batches small for nothing
        others = [
            d for d in self.active_devices() if d is not device and not self._host_sits_out(d)
        ]
        if not others:
            return budget
        now = self.clock()
        # While texts are still being tokenized, the end is not near: what is queued now is
        # only part of the work, and balancing it as if it were all would cut tiny batches.
        remaining = self.pending_tokens + self.unfed_tokens()
        # Launching holds the one host thread: the others' launches wait for this one. When
        # the host is the limit (MiniLM beside a co-tenant-slowed GPU), a small last batch on
        # a slow device costs more than it saves.
        host = device.launch_s

        def mine(tokens: float) -> float:
            return self._finish_at(device, tokens, now)

        shortest = float(self._first_length(End.SHORT) or 1)

        def theirs(tokens: float) -> float:
            left = remaining - tokens
            if 0 < left < shortest:
                left = shortest  # work is whole items: a sliver left over is one more item
            return self._drain_time(others, left, now, host_free=now + host if tokens else now)

        def makespan(tokens: float) -> float:
            return max(mine(tokens), theirs(tokens)) if tokens > 0 else theirs(0.0)

        high = min(float(budget), remaining)
        if mine(high) <= theirs(high):
            return budget
        # Near the end: take the amount that ends all the work soonest. Finishing times cross
        # between one item and `high`; taking everything (`high`) or nothing can still win,
        # since whoever takes a leftover pays one more batch's fixed cost.
        first = min(float(self._first_length(end) or 1), high)
        low, top = first, high
        if mine(first) <= theirs(first):
            for _ in range(30):
                middle = (low + top) / 2
                if mine(middle) <= theirs(middle):
                    low = middle
                else:
                    top = middle
        best = min((high, low, 0.0), key=makespan)  # ties go to the larger claim
        if best > 0:
            return max(1, math.ceil(best))
        if not any(d.inflight for d in self.devices) and device is self._first_to_progress():
            return max(1, math.ceil(first))  # nobody is working: progress first
        return None

    def _first_to_progress(self) -> DeviceSlot | None:
        """The device that claims when every device would rather leave the rest to others:
        the fastest that does not sit out (a host device ranked first by its rate at its full
        budget, beside accelerators whose budgets shrank, would leave it to nobody)."""
        return next((d for d in self.ranked() if not self._host_sits_out(d)), None)

    def _first_length(self, end: End) -> int | None:
        """Length of the first item a claim from `end` would take."""
        for generation in sorted(self._generations):
            buckets = self._generations[generation]
            length = buckets.longest() if end is End.LONG else buckets.shortest()
            if length is not None:
                return length
        return None

    def _finish_at(self, device: DeviceSlot, tokens: float, now: float) -> float:
        """When the device would finish a batch of `tokens` claimed now: after the claims it
        holds, and not before the batch is launched (launching holds the host's one thread).
        A device whose batches stray from its fit plans on the slow side, for the claims it
        holds too: ending late holds up all the work, ending early only leaves the others a
        little more."""
        margin = 1 + device.speed.spread
        held = (self._free_at(device, now) - now) * margin
        return now + max(held, device.launch_s) + device.speed.seconds(tokens) * margin

    def _free_at(self, device: DeviceSlot, now: float) -> float:
        """When the device will have finished the claims it holds."""
        at = now
        for claim in device.inflight:
            if claim.started_at is None:
                at += claim.expected_s
            else:
                at += max(0.0, claim.expected_s - (now - claim.started_at))
        return at

    def _drain_time(
        self,
        devices: Sequence[DeviceSlot],
        tokens: float,
        now: float,
        host_free: float | None = None,
    ) -> float:
        """When `devices` together would finish their own claims plus `tokens` more.

        Each device starts once its claims are done and its next batch is launched (the host
        thread is free from `host_free` on), then runs full batches, each paying the fixed
        cost, then one partial batch. Devices not yet measured are not counted on: their
        speed is only a guess.
        """
        helpers = [d for d in devices if d.speed.samples or d.speed.measured] or list(devices)
        launched = now if host_free is None else host_free
        free = [(max(self._free_at(d, now), launched + d.launch_s), d) for d in helpers]
        last_free = max(self._free_at(d, now) for d in devices)
        if tokens <= 0:
            return last_free

        def capacity(at: float) -> float:
            total = 0.0
            for free_at, device in free:
                running = at - free_at
                if running <= 0:
                    continue
                full_s = device.speed.seconds(device.budget)
                full = math.floor(running / full_s)
                partial = (running - full * full_s - device.speed.fixed) * device.speed.rate
                total += full * device.budget + min(device.budget, max(0.0, partial))
            return total

        low = min(f for f, _ in free)
        high = max(f + d.speed.seconds(tokens) for f, d in free)  # any one device alone
        for _ in range(40):
            middle = (low + high) / 2
            if capacity(middle) >= tokens:
                high = middle
            else:
                low = middle
        return max(last_free, high)

    # -- finishing -----------------------------------------------------------------------

    def holds(self, claim: Claim) -> bool:
        """Whether the claim is still its device's; a revoked claim's results are dropped."""
        return any(c is claim for c in claim.device.inflight)

    def complete(self, claim: Claim, seconds: float | None = None) -> list[Job]:
        """Record a finished batch. The caller has written the rows of live jobs; returns the
        jobs this batch finished. A revoked claim (its device was quarantined) is ignored."""
        device = claim.device
        if not self._take_inflight(claim):
            return []
        now = self.clock()
        started = claim.started_at if claim.started_at is not None else claim.claimed_at
        elapsed = seconds if seconds is not None else now - started
        device.speed.observe(claim.tokens, elapsed)
        device.outcomes.append(True)
        device.tokens_done += claim.tokens
        device.batches_done += 1
        if device.budget < device.full_budget:  # memory short once may have been a moment's
            device.clean_batches += 1
            if device.clean_batches >= REGROW_AFTER:
                device.budget = min(device.full_budget, 2 * device.budget)
                device.clean_batches = 0
        device.busy_s += elapsed
        device.last_done_at = now
        finished: list[Job] = []
        for item in claim.items:
            job = item.job
            if job.cancelled:
                continue
            job.remaining -= 1
            if job.remaining == 0:
                job.finish(now)
                finished.append(job)
        self._wake_all()
        return finished

    def fail(self, claim: Claim, error: BaseException, *, out_of_memory: bool = False) -> None:
        """A batch failed. Its items go back; on OOM the device's budget halves; a device that
        keeps failing is quarantined; an item that keeps failing fails its job."""
        device = claim.device
        if not self._take_inflight(claim):
            return
        now = self.clock()
        if out_of_memory:
            device.budget = max(1, device.budget // 2)
            device.clean_batches = 0
        # Running out of memory is the batch's size, not its items' or the device's fault,
        # unless it was one item: then both count, so that a device short of memory for even
        # one text (a co-tenant holds it) is taken out before it fails texts others could run.
        blame = not out_of_memory or len(claim.items) == 1
        if blame:
            device.outcomes.append(False)
        retry: list[Item] = []
        for item in claim.items:
            item.attempts += blame
            if item.job.cancelled:
                continue
            if item.attempts >= self.max_item_attempts:
                self._fail_job(
                    item.job,
                    EmbeddingFailed(
                        f"input {item.index} failed in {item.attempts} batches; last error: "
                        f"{type(error).__name__}: {error}"
                    ),
                    now,
                )
            else:
                retry.append(item)
        self._requeue(retry)
        failed = device.outcomes.count(False)
        if failed >= self.quarantine_after:
            self.quarantine(
                device,
                f"{failed} of its last {len(device.outcomes)} batches failed; last: {error!r}",
            )
        self._wake_all()

    def release(self, claim: Claim) -> None:
        """Give back a claim that was never run (its worker stopped)."""
        if self._take_inflight(claim):
            self._requeue(claim.items)
            self._wake_all()

    def quarantine(self, device: DeviceSlot, reason: str) -> None:
        """Take a device out of service and give its claims to the others."""
        if not device.active:
            return
        device.state = DeviceState.QUARANTINED
        device.reason = reason
        log.warning("%s: %s taken out of service: %s", self.name, device.name, reason)
        revoked, device.inflight = device.inflight, []
        for claim in revoked:
            self._requeue(claim.items)
        if not self.active_devices():
            self._fail_all(
                NoDeviceAvailable(f"every device of this model is quarantined: {reason}")
            )
        self._wake_all()

    def close(self, error: BaseException | None = None) -> None:
        """Fail every pending job (used when a model is torn down without draining)."""
        self.closed = True
        self._fail_all(error or ShuttingDown("the model was unloaded; send the request again"))
        self._wake_all()

    # -- internals -----------------------------------------------------------------------

    def _take_inflight(self, claim: Claim) -> bool:
        inflight = claim.device.inflight
        for position, held in enumerate(inflight):
            if held is claim:
                del inflight[position]
                if position == 0 and inflight and inflight[0].started_at is None:
                    inflight[0].started_at = self.clock()
                return True
        return False

    def _requeue(self, items: Iterable[Item]) -> None:
        for item in items:
            job = item.job
            if job.cancelled:
                continue
            buckets = self._generations.get(item.generation)
            if buckets is None:
                buckets = self._generations[item.generation] = LengthBuckets()
            buckets.push(item)
            job.pending_items += 1
            job.pending_tokens += item.length
            self.pending_items += 1
            self.pending_tokens += item.length

    def _fail_job(self, job: Job, error: BaseException, now: float) -> None:
        if job.cancelled:
            return
        self._forget_pending(job)
        job.fail(error, now)

    def _fail_all(self, error: BaseException) -> None:
        now = self.clock()
        jobs = {id(item.job): item.job for item in self._pending_items()}
        jobs.update(self._feeding)  # still tokenizing: told now, not at their next chunk
        for device in self.devices:
            for claim in device.inflight:
                for item in claim.items:
                    jobs[id(item.job)] = item.job
        for job in jobs.values():
            self._fail_job(job, error, now)
        self._generations.clear()

    def _pending_items(self) -> Iterable[Item]:
        for buckets in self._generations.values():
            yield from buckets.items()

    def _host_better_left_to_feeding(self, device: DeviceSlot) -> bool:
        """Whether a device computing on the host's CPU should stay idle so the host feeds the
        accelerators: the host tokenizes, and its one event-loop thread launches every batch.
        So it waits while texts are being tokenized, and sits out entirely when its best share
        of the work is below MIN_HOST_SHARE: its batches would cost the accelerators more (cores,
        and the interpreter lock its forward holds) than it adds."""
        if self.feeding:
            return bool(self._active_accelerators())
        return self._host_sits_out(device)

    def _host_sits_out(self, device: DeviceSlot) -> bool:
        """Whether a device on the host's CPU leaves all the work to the accelerators: its
        best share of it is below MIN_HOST_SHARE (see `_host_better_left_to_feeding`)."""
        if not device.shares_host:
            return False
        accelerators = self._active_accelerators()
        total = device.speed.rate + sum(d.speed.rate for d in accelerators)
        return bool(accelerators) and device.speed.rate < MIN_HOST_SHARE * total

    def _better_left_to_faster(self, device: DeviceSlot) -> bool:
        """Whether, while texts are still arriving, a device should leave what is queued to
        faster devices that would finish all of it, after what they hold, before it could
        finish its own batch.

        Arriving texts wake every device, and whichever runs first would claim them: often a
        slow one, while a fast one's batches in flight are done but not yet collected. When
        the feed sets the pace, that slow batch only costs the host a launch and risks ending
        last (MiniLM beside a GPU slowed by a co-tenant ran 17% slower than on the fast GPU
        alone). Once every text is queued, the end game in `_tail_target` decides who takes
        what."""
        if not self.feeding:
            return False
        ranked = self.ranked()  # `claim` asks only for active devices: this one is there
        # not a host device: it waits while texts are fed (`_host_better_left_to_feeding`)
        faster = [d for d in ranked[: ranked.index(device)] if not d.shares_host]
        if not faster:
            return False
        now = self.clock()
        mine = self._finish_at(device, min(device.budget, self.pending_tokens), now)
        return self._drain_time(faster, self.pending_tokens, now) <= mine

    def _wake_all(self) -> None:
        for device in self.devices:
            device.wakeup.set()

    async def wait_for_work(self, device: DeviceSlot) -> None:
        """Sleep until something changes that may give this device work."""
        await device.wakeup.wait()
        device.wakeup.clear()
