"""Histograms that the queue, engine and registry fill and /metrics renders."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
TOKEN_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144)
INPUT_TOKEN_BUCKETS = tuple(2**i for i in range(4, 16))  # a text's tokens: 16 to 32768
BATCH_ITEM_BUCKETS = tuple(2**i for i in range(13))  # a batch's texts: 1 to 4096


class Histogram:
    """A Prometheus-style histogram: counts per bucket, a sum and a count."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def observe_all(self, values: Sequence[int]) -> None:
        """Each of `values` observed: a tokenized chunk's lengths, at once."""
        for value in values:
            self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += len(values)
        self.total += sum(values)

    @classmethod
    def merged(cls, histograms: Iterable[Histogram], bounds: Sequence[float]) -> Histogram:
        """One histogram of every observation of `histograms`, each with these `bounds`."""
        merged = cls(bounds)
        for histogram in histograms:
            assert histogram.bounds == merged.bounds, "only histograms of one kind merge"
            merged.counts = [a + b for a, b in zip(merged.counts, histogram.counts, strict=True)]
            merged.count += histogram.count
            merged.total += histogram.total
        return merged
