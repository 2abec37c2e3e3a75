"""Pending items by length and generation, and the token-budget batches (`Cut`) cut from them."""

from __future__ import annotations

import bisect
import enum
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from embedx.scheduling.work import Item


class End(enum.Enum):
    """Which end of the length order a device claims from."""

    LONG = "long"
    SHORT = "short"


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


@dataclass(slots=True)
class Generations:
    """Pending items by generation, each in its LengthBuckets. A cut serves the oldest
    generation first and seals the open one, so newcomers form the next: a request never
    starves behind a stream of newer ones."""

    _buckets: dict[int, LengthBuckets] = field(default_factory=dict)
    _open: int = 0  # the generation submitted items join

    def add(self, items: Sequence[Item], now: float) -> int:
        """Queue items in the open generation; returns their tokens."""
        generation = self._open
        buckets = self._buckets.get(generation)
        if buckets is None:
            buckets = self._buckets[generation] = LengthBuckets()
        tokens = 0
        for item in items:
            item.generation = generation
            item.enqueued_at = now
            tokens += item.length
            buckets.push(item)
        return tokens

    def put_back(self, item: Item) -> None:
        """Queue an item again, in the generation it first joined."""
        buckets = self._buckets.get(item.generation)
        if buckets is None:
            buckets = self._buckets[item.generation] = LengthBuckets()
        buckets.push(item)

    def cut(self, end: End, cut: Cut) -> None:
        """Fill `cut` from `end`, oldest generation first."""
        for generation in sorted(self._buckets):
            buckets = self._buckets[generation]
            buckets.cut(end, cut)
            if buckets.count == 0:
                del self._buckets[generation]
            if generation == self._open:
                self._open += 1  # newcomers form the next generation
            if buckets.count:
                break  # the cut stopped short of this generation's end: the batch is full

    def first_length(self, end: End) -> int | None:
        """Length of the first item a cut from `end` would take."""
        for generation in sorted(self._buckets):
            buckets = self._buckets[generation]
            length = buckets.longest() if end is End.LONG else buckets.shortest()
            if length is not None:
                return length
        return None

    def items(self) -> Iterator[Item]:
        """Every item held, in no particular order."""
        for buckets in self._buckets.values():
            yield from buckets.items()

    def clear(self) -> None:
        self._buckets.clear()
