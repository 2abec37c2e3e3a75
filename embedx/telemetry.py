"""Counters and histograms that the queue, engine and registry fill and /metrics renders."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence

LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
TOKEN_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144)


class Histogram:
    """A Prometheus-style histogram that also keeps the last samples for percentiles."""

    __slots__ = ("bounds", "count", "counts", "recent", "total")

    def __init__(self, bounds: Sequence[float], recent: int = 4096) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0
        self.recent: deque[float] = deque(maxlen=recent)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value
        self.recent.append(value)

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0-100) of the recent samples, or None if there are none."""
        if not self.recent:
            return None
        ordered = sorted(self.recent)
        rank = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
        return ordered[rank]
