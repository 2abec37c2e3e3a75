"""TEI's per-request counts and times (its `te_request_*` metrics) and its per-route counts
of inputs (`te_embed_*`, `te_predict_*`), kept as TEI keeps them for each embedding or scoring
request whose body parsed, so that /metrics serves them under TEI's names and labels."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Iterator
from typing import Literal, TypeVar

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
# TEI's route families: `embed` for every embedding route, `predict` for scoring (its /predict
# and /rerank both call its `predict`)
Kind = Literal["embed", "predict"]
R = TypeVar("R", EmbedResult, ScoreResult)


class TeiMetrics:
    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()  # by TEI's `method`: single or batch
        self.successes: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()  # by TEI's `err`
        # Inputs (texts or pairs) by kind: handed to the model, and answered (te_embed_count,
        # te_embed_success, te_predict_*). TEI counts each input as it calls its inference.
        self.inputs: Counter[Kind] = Counter()
        self.answered: Counter[Kind] = Counter()
        self.duration = Histogram(LATENCY_BUCKETS_S)
        self.tokenization = Histogram(LATENCY_BUCKETS_S)
        self.inference = Histogram(LATENCY_BUCKETS_S)

    @contextlib.contextmanager
    def request(self, kind: Kind, inputs: int) -> Iterator[RequestRecord]:
        """One request of `inputs` texts or pairs (one is TEI's "single", more its "batch"),
        counted, and its outcome once the block ends; its inputs once `RequestRecord.run`
        hands them to the model."""
        method = "single" if inputs == 1 else "batch"
        self.requests[method] += 1
        record = RequestRecord(self, kind, inputs)
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
            self.answered[kind] += inputs
            result = record.result
            self.duration.observe(result.total_s)
            self.tokenization.observe(result.tokenize_s)
            self.inference.observe(result.total_s - result.tokenize_s)


class RequestRecord:
    """A request's call of its model, and its result."""

    __slots__ = ("inputs", "kind", "metrics", "result")

    def __init__(self, metrics: TeiMetrics, kind: Kind, inputs: int) -> None:
        self.metrics = metrics
        self.kind = kind
        self.inputs = inputs
        self.result: EmbedResult | ScoreResult | None = None

    async def run(self, call: Awaitable[R]) -> R:
        """The model's call (`engine.embed` or `engine.score`): its inputs counted as it
        starts, as TEI counts them once a request holds a permit; its result kept."""
        self.metrics.inputs[self.kind] += self.inputs
        self.result = result = await call
        return result


def _failure(error: EmbedxError) -> str:
    return FAILURES.get(error.code) or ("validation" if error.status < 500 else "inference")
