"""ConvergingQueue: the one owner of pending work, from which devices claim batches at either end.

Items carry a generation: a claim serves the oldest generation first, so a request never
starves behind newcomers. What to claim, and whether to claim at all, is the policy's
(`embedx.scheduling.policy`), read off a frozen view of this queue. Failures put work back:
nothing a caller submitted is lost.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from embedx.errors import EmbeddingFailed, NoDeviceAvailable, ShuttingDown
from embedx.scheduling import policy
from embedx.scheduling.buckets import Cut, End, Generations
from embedx.scheduling.slots import QUARANTINE_AFTER_FAILURES, Claim, DeviceSlot
from embedx.scheduling.speed import SpeedModel
from embedx.scheduling.view import DeviceView, QueueView
from embedx.scheduling.work import Item, Job
from embedx.telemetry import LATENCY_BUCKETS_S, Histogram

log = logging.getLogger("embedx.scheduling")

MAX_ITEM_ATTEMPTS = 4  # failed batches an item may be part of before its job fails


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
        self._pending = Generations()
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

    # -- submitting and cancelling -------------------------------------------------------

    def submit(self, job: Job, items: Sequence[Item]) -> None:
        """Add a job's items (all or a chunk of them) to the open generation."""
        if self.closed:
            raise ShuttingDown("the model is unloading; send the request again")
        if not self.active_devices():
            raise NoDeviceAvailable("every device of this model is quarantined")
        if job.cancelled:  # it failed or was cancelled while these texts were tokenized
            return
        tokens = self._pending.add(items, self.clock())
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

    # -- claiming ------------------------------------------------------------------------

    def view(self, device: DeviceSlot) -> tuple[QueueView, DeviceView]:
        """What the claim policy reads now, and the part of it that is `device` (active)."""
        now = self.clock()
        active = self.active_devices()
        devices = tuple(d.view(now) for d in active)
        view = QueueView(
            now,
            devices,
            self.pending_tokens,
            self.unfed_tokens(),
            self.feeding,
            self._pending.first_length(End.SHORT),
            self._pending.first_length(End.LONG),
        )
        return view, devices[active.index(device)]

    def claim(self, device: DeviceSlot) -> Claim | None:
        """Take the next batch for `device`, or None if it has nothing useful to do now."""
        if not device.active or len(device.inflight) >= device.max_inflight:
            return None
        if self.pending_items <= 0:
            return None
        view, me = self.view(device)
        if (
            policy.host_waits(view, me)
            or policy.better_left_to_faster(view, me)
            or policy.gathers_first(view, me)
        ):
            return None
        end = policy.end_for(view, me)
        target = policy.tail_target(view, me, end)
        if target is None:
            return None
        cut = Cut(device.budget, target, self.max_batch_items)
        self._pending.cut(end, cut)
        if not cut.items:
            return None
        now = view.now
        oldest = now
        for item in cut.items:
            job = item.job
            job.pending_items -= 1
            job.pending_tokens -= item.length
            oldest = min(oldest, item.enqueued_at)
        self.queue_wait.observe(now - oldest)  # per batch: its longest-waiting item
        self.pending_items -= len(cut.items)
        self.pending_tokens -= cut.tokens
        claim = device.take(next(self._claim_ids), cut, now)
        self.padding_tokens += claim.area - claim.tokens
        return claim

    # -- finishing -----------------------------------------------------------------------

    def holds(self, claim: Claim) -> bool:
        """Whether the claim is still its device's; a revoked claim's results are dropped."""
        return claim.device.holds(claim)

    def complete(self, claim: Claim, seconds: float | None = None) -> list[Job]:
        """Record a finished batch. The caller has written the rows of live jobs; returns the
        jobs this batch finished. A revoked claim (its device was quarantined) is ignored."""
        now = self.clock()
        if not claim.device.let_go(claim, now):
            return []
        started = claim.started_at if claim.started_at is not None else claim.claimed_at
        claim.device.finished(claim, seconds if seconds is not None else now - started, now)
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
        now = self.clock()
        if not device.let_go(claim, now):
            return
        if out_of_memory:
            device.out_of_memory()
        # Running out of memory is the batch's size, not its items' or the device's fault,
        # unless it was one item: then both count, so that a device short of memory for even
        # one text (a co-tenant holds it) is taken out before it fails texts others could run.
        blame = not out_of_memory or len(claim.items) == 1
        if blame:
            device.failed()
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
        if device.failures >= self.quarantine_after:
            self.quarantine(
                device,
                f"{device.failures} of its last {len(device.outcomes)} batches failed; "
                f"last: {error!r}",
            )
        self._wake_all()

    def release(self, claim: Claim) -> None:
        """Give back a claim that was never run (its worker stopped)."""
        if claim.device.let_go(claim, self.clock()):
            self._requeue(claim.items)
            self._wake_all()

    def quarantine(self, device: DeviceSlot, reason: str) -> None:
        """Take a device out of service and give its claims to the others."""
        if not device.active:
            return
        log.warning("%s: %s taken out of service: %s", self.name, device.name, reason)
        for claim in device.quarantine(reason):
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

    async def wait_for_work(self, device: DeviceSlot) -> None:
        """Sleep until something changes that may give this device work."""
        await device.wakeup.wait()
        device.wakeup.clear()

    # -- internals -----------------------------------------------------------------------

    def _requeue(self, items: Iterable[Item]) -> None:
        for item in items:
            job = item.job
            if job.cancelled:
                continue
            self._pending.put_back(item)
            job.pending_items += 1
            job.pending_tokens += item.length
            self.pending_items += 1
            self.pending_tokens += item.length

    def _forget_pending(self, job: Job) -> None:
        self.pending_items -= job.pending_items
        self.pending_tokens -= job.pending_tokens
        job.pending_items = job.pending_tokens = 0
        if self.pending_items == 0:  # what the buckets hold is dead, with its token ids
            self._pending.clear()

    def _fail_job(self, job: Job, error: BaseException, now: float) -> None:
        if job.cancelled:
            return
        self._forget_pending(job)
        job.fail(error, now)

    def _fail_all(self, error: BaseException) -> None:
        now = self.clock()
        jobs = {id(item.job): item.job for item in self._pending.items()}
        jobs.update(self._feeding)  # still tokenizing: told now, not at their next chunk
        for device in self.devices:
            for claim in device.inflight:
                for item in claim.items:
                    jobs[id(item.job)] = item.job
        for job in jobs.values():
            self._fail_job(job, error, now)
        self._pending.clear()

    def _wake_all(self) -> None:
        for device in self.devices:
            device.wakeup.set()
