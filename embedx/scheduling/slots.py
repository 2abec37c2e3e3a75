"""DeviceSlot, the queue's record of one device (claims in flight, budget, health), and Claim."""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from dataclasses import dataclass, field

from embedx.scheduling.buckets import Cut
from embedx.scheduling.speed import SpeedModel
from embedx.scheduling.view import DeviceView
from embedx.scheduling.work import Item

# A device is taken out once this many of its last QUARANTINE_WINDOW batches failed: not
# only in a row, or one that fails two batches of three, succeeding in between, would keep
# failing the items it takes back (each failure counts against them) and never be taken out.
QUARANTINE_AFTER_FAILURES = 3
QUARANTINE_WINDOW = 5
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
    # and the tokenizer's hand-offs share: device time alone misses it (see
    # `policy.tail_target`).
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

    def free_at(self, now: float) -> float:
        """When the device will have finished the claims it holds."""
        at = now
        for claim in self.inflight:
            if claim.started_at is None:
                at += claim.expected_s
            else:
                at += max(0.0, claim.expected_s - (now - claim.started_at))
        return at

    def view(self, now: float) -> DeviceView:
        """What the claim policy reads of this device at `now`."""
        speed = self.speed
        return DeviceView(
            self.name,
            self.budget,
            speed.rate,
            speed.fixed,
            speed.spread,
            speed.known,
            self.launch_s,
            self.shares_host,
            self.free_at(now),
            len(self.inflight),
        )

    def take(self, claim_id: int, cut: Cut, now: float) -> Claim:
        """Hold a batch just cut for this device: it starts now if the device is idle."""
        expected = self.speed.seconds(cut.tokens)
        started = None if self.inflight else now
        claim = Claim(claim_id, self, cut.items, cut.tokens, cut.longest, now, expected, started)
        self.inflight.append(claim)
        return claim

    def holds(self, claim: Claim) -> bool:
        return any(c is claim for c in self.inflight)

    def let_go(self, claim: Claim, now: float) -> bool:
        """Remove a claim it holds (false if it does not); the next one in line starts now."""
        inflight = self.inflight
        for position, held in enumerate(inflight):
            if held is claim:
                del inflight[position]
                if position == 0 and inflight and inflight[0].started_at is None:
                    inflight[0].started_at = now
                return True
        return False

    def finished(self, claim: Claim, seconds: float, now: float) -> None:
        """Record a batch that ran: its speed, its success, and a budget that may regrow."""
        self.speed.observe(claim.tokens, seconds)
        self.outcomes.append(True)
        self.tokens_done += claim.tokens
        self.batches_done += 1
        if self.budget < self.full_budget:  # memory short once may have been a moment's
            self.clean_batches += 1
            if self.clean_batches >= REGROW_AFTER:
                self.budget = min(self.full_budget, 2 * self.budget)
                self.clean_batches = 0
        self.busy_s += seconds
        self.last_done_at = now

    def out_of_memory(self) -> None:
        """A batch ran out of memory: the budget halves until batches run clean again."""
        self.budget = max(1, self.budget // 2)
        self.clean_batches = 0

    def failed(self) -> None:
        """Record a batch that failed by the device's fault."""
        self.outcomes.append(False)

    @property
    def failures(self) -> int:
        """How many of its last QUARANTINE_WINDOW batches failed by its fault."""
        return self.outcomes.count(False)

    def quarantine(self, reason: str) -> list[Claim]:
        """Take the device out of service; returns the claims it held, now revoked."""
        self.state = DeviceState.QUARANTINED
        self.reason = reason
        revoked, self.inflight = self.inflight, []
        return revoked


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
