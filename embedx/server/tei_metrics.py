"""TEI's per-request counts and times (its `te_request_*` metrics), kept as TEI keeps them
for each embedding or scoring request whose body parsed, so that /metrics serves them under
TEI's names and labels."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator

from embedx.engine import EmbedResult, ScoreResult
from embedx.errors import EmbedxError
from embedx.telemetry import LATENCY_BUCKETS_S, Histogram

# TEI's `err` label for each failure it names; any other 4xx is "validation" and any other
# 5xx "inference", as in TEI. (Too many inputs, TEI's "batch_size", is refused on parsing,
# before a request is counted.)
FAILURES = {
    "wrong_model_task": "model_type",
    "queue_timeout": "overloaded",
    "models_busy": "overloaded",
}
DROPPED = "dropped"  # TEI's label for work whose client left


class TeiMetrics:
    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()  # by TEI's `method`: single or batch
        self.successes: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()  # by TEI's `err`
        self.duration = Histogram(LATENCY_BUCKETS_S)
        self.tokenization = Histogram(LATENCY_BUCKETS_S)
        self.inference = Histogram(LATENCY_BUCKETS_S)

    @contextlib.contextmanager
    def request(self, inputs: int) -> Iterator[RequestRecord]:
        """One request of `inputs` texts or pairs (one is TEI's "single", more its "batch"),
        counted, and its outcome once the block ends."""
        method = "single" if inputs == 1 else "batch"
        self.requests[method] += 1
        record = RequestRecord()
        try:
            yield record
        except EmbedxError as error:
            self.failures[_failure(error)] += 1
            raise
        except asyncio.CancelledError:
            self.failures[DROPPED] += 1
            raise
        except Exception:  # a bug: the guard answers a 500
            self.failures["inference"] += 1
            raise
        if record.result is not None:
            self.successes[method] += 1
            result = record.result
            self.duration.observe(result.total_s)
            self.tokenization.observe(result.tokenize_s)
            self.inference.observe(result.total_s - result.tokenize_s)


class RequestRecord:
    """Where a request's route leaves its result."""

    __slots__ = ("result",)

    def __init__(self) -> None:
        self.result: EmbedResult | ScoreResult | None = None


def _failure(error: EmbedxError) -> str:
    return FAILURES.get(error.code) or ("validation" if error.status < 500 else "inference")
