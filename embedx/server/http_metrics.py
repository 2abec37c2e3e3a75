"""The guard's counts of HTTP requests: by route, method and status; errors by route, status
and code; latency by route."""

from __future__ import annotations

from collections import Counter

from embedx.telemetry import LATENCY_BUCKETS_S, Histogram

# Methods counted by name; any other is "other", as unknown paths are: a client sending
# made-up methods must not grow the series without bound.
COUNTED_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
# The status recorded for a request whose client hung up before its response (nginx's):
# counted as a request, not as an error of the server's.
CLIENT_CLOSED = 499


class HttpMetrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str, int]] = Counter()
        self.errors: Counter[tuple[str, int, str]] = Counter()
        self.latency: dict[str, Histogram] = {}

    def observe(
        self, route: str, method: str, status: int, seconds: float, code: str | None = None
    ) -> None:
        counted = method if method in COUNTED_METHODS else "other"
        self.requests[(route, counted, status)] += 1
        if status >= 400 and status != CLIENT_CLOSED:  # 503 alone says too little to act on
            self.errors[(route, status, code or "other")] += 1
        histogram = self.latency.get(route)
        if histogram is None:
            histogram = self.latency[route] = Histogram(LATENCY_BUCKETS_S)
        histogram.observe(seconds)
