"""Work records (Job, Item) and LengthBuckets, which cut token-budget batches from either end."""

from __future__ import annotations

import asyncio
import bisect
import enum
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NO_IDS = np.empty(0, dtype=np.int32)


class End(enum.Enum):
    """Which end of the length order a device claims from."""

    LONG = "long"
    SHORT = "short"


@dataclass(frozen=True, slots=True)
class RowForm:
    """What a request's rows are made into: L2-normalized (`unit`), then base64 of their
    float32 bytes (`base64`). Where every request of a batch wants the same, its device does
    it."""

    unit: bool = False
    base64: bool = False


FLOATS = RowForm()


class Job:
    """One caller's request: its reply future, its progress and its clocks.

    The queue owns `remaining` and `pending_tokens`; whoever embeds writes rows into `out`.
    """

    __slots__ = (
        "cancelled",
        "error",
        "fed",
        "finished_at",
        "form",
        "future",
        "out",
        "pending_items",
        "pending_tokens",
        "remaining",
        "size",
        "submitted_at",
        "tokens",
    )

    def __init__(self, size: int, *, future: asyncio.Future[None] | None = None) -> None:
        self.size = size
        self.remaining = size
        self.fed = 0  # texts queued so far: all of them once tokenization is done
        self.tokens = 0
        self.pending_items = 0
        self.pending_tokens = 0
        self.cancelled = False
        self.error: BaseException | None = None
        self.future = future
        self.out: Any = None  # the caller's rows, written by whoever runs the batches
        self.form = FLOATS  # what its rows are made into before they are written
        self.submitted_at = time.monotonic()
        self.finished_at: float | None = None

    def finish(self, now: float) -> None:
        self.finished_at = now
        if self.future is not None and not self.future.done():
            self.future.set_result(None)

    def fail(self, error: BaseException, now: float) -> None:
        self.cancelled = True
        self.out = None  # read by no one now: not kept while its queued items wait to be swept
        self.error = error
        self.finished_at = now
        if self.future is not None and not self.future.done():
            self.future.set_exception(error)


@dataclass(slots=True, eq=False)
class Item:
    """One text of a job: its place in the caller's list and its token ids."""

    job: Job
    index: int
    length: int
    ids: np.ndarray = field(default_factory=lambda: NO_IDS)  # (length,) int32: a chunk's view
    generation: int = 0
    enqueued_at: float = 0.0
    attempts: int = 0


@dataclass(slots=True)
class LengthBuckets:
    """Pending items grouped by token length, so either end is reached in O(1).

    Within one length, items leave in arrival order.
    """

    _by_length: dict[int, deque[Item]] = field(default_factory=dict)
    _lengths: list[int] = field(default_factory=list)  # sorted, only non-empty lengths
    count: int = 0  # items held, those of cancelled jobs included until they are cut

    def push(self, item: Item) -> None:
        bucket = self._by_length.get(item.length)
        if bucket is None:
            bucket = self._by_length[item.length] = deque()
            bisect.insort(self._lengths, item.length)
        bucket.append(item)
        self.count += 1

    def push_all(self, items: Iterable[Item]) -> None:
        for item in items:
            self.push(item)

    def items(self) -> Iterator[Item]:
        """Every item held, in no particular order."""
        for bucket in self._by_length.values():
            yield from bucket

    def shortest(self) -> int | None:
        return self._lengths[0] if self._lengths else None

    def longest(self) -> int | None:
        return self._lengths[-1] if self._lengths else None

    def cut(self, end: End, cut: Cut) -> None:
        """Move items from `end` into `cut` until it admits no more or this structure is empty.

        Items of cancelled jobs are dropped on the way.
        """
        lengths = self._lengths
        position = -1 if end is End.LONG else 0
        while lengths:
            length = lengths[position]
            bucket = self._by_length[length]
            # Within one length, how many more items fit is arithmetic, not a per-item test:
            # they move in bulk, those of cancelled jobs dropped on the way.
            room = cut.room(length)
            while bucket and room > 0:
                taken = [bucket.popleft() for _ in range(min(room, len(bucket)))]
                self.count -= len(taken)
                live = [item for item in taken if not item.job.cancelled]
                cut.add_all(live, length)
                room -= len(live)
            if bucket:
                return
            del self._by_length[length]
            lengths.pop(position)


@dataclass(slots=True)
class Cut:
    """A batch being cut, and its limits.

    `area_budget` bounds the padded size, `count * longest`, which is what memory pays for;
    `token_target` bounds the real tokens, which is what time pays for. The first item is
    always admitted, so an item longer than the budget is a batch of one.
    """

    area_budget: int
    token_target: int
    max_items: int | None = None
    items: list[Item] = field(default_factory=list)
    longest: int = 0
    tokens: int = 0

    def room(self, length: int) -> int:
        """How many more items of `length` the batch admits (at least one if it is empty)."""
        count = len(self.items)
        if not count:
            return 1 + self.room_after_first(length)
        fits = min(
            self.area_budget // max(self.longest, length) - count,
            (self.token_target - self.tokens) // length,
        )
        if self.max_items is not None:
            fits = min(fits, self.max_items - count)
        return max(0, fits)

    def room_after_first(self, length: int) -> int:
        fits = min(self.area_budget // length - 1, (self.token_target - length) // length)
        if self.max_items is not None:
            fits = min(fits, self.max_items - 1)
        return max(0, fits)

    def add_all(self, items: list[Item], length: int) -> None:
        """Admit items all of `length` tokens."""
        if items:
            self.items.extend(items)
            self.tokens += length * len(items)
            self.longest = max(self.longest, length)

    @property
    def area(self) -> int:
        return len(self.items) * self.longest
