"""/metrics: one Prometheus collector, read at scrape time, over the guard's HTTP counts,
admission and the registry's snapshot (its models' engine reports among it); and the same
figures again under TEI's names (`te_*`, docs/metrics.md), for TEI's dashboards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

from embedx.telemetry import (
    BATCH_ITEM_BUCKETS,
    INPUT_TOKEN_BUCKETS,
    LATENCY_BUCKETS_S,
    TOKEN_BUCKETS,
    Histogram,
)

if TYPE_CHECKING:
    from embedx.engine.report import DeviceReport, EngineReport
    from embedx.registry import ModelRegistry
    from embedx.registry.report import RegistryReport
    from embedx.server.admission import Admission
    from embedx.server.http_metrics import HttpMetrics
    from embedx.server.tei_metrics import TeiMetrics

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
# A family's kind, and the class that holds its samples.
KINDS: dict[str, Callable[..., Metric]] = {
    "counter": CounterMetricFamily,
    "gauge": GaugeMetricFamily,
    "histogram": HistogramMetricFamily,
    # TEI's counters, named as TEI's exporter names them (no _total, which a counter family
    # here would add): Prometheus reads them alike
    "untyped": UnknownMetricFamily,
}
# Per model: (metric, kind, help, value of its report); a histogram's value is a Histogram.
MODEL_FAMILIES: tuple[tuple[str, str, str, Callable[[EngineReport], Any]], ...] = (
    ("embedx_queue_items", "gauge", "Texts waiting in a model's queue.",
     lambda e: e.queue_items),
    ("embedx_queue_tokens", "gauge", "Tokens waiting in a model's queue.",
     lambda e: e.queue_tokens),
    ("embedx_queue_wait_seconds", "histogram", "A batch's oldest text, queued to claimed.",
     lambda e: e.queue_wait),
    ("embedx_embed_seconds", "histogram", "From an embed call to its vectors.",
     lambda e: e.latency),
    ("embedx_input_tokens", "histogram", "Each text's (or pair's) tokens, once truncated.",
     lambda e: e.input_tokens),
    ("embedx_padding_tokens_total", "counter", "Padded minus real tokens of batches cut.",
     lambda e: e.padding_tokens),
    ("embedx_truncated_inputs_total", "counter", "Texts cut to the model's length.",
     lambda e: e.truncated_inputs),
    ("embedx_tokenizer_busy_seconds_total", "counter",
     "Time a tokenizer call was running; near the uptime, tokenizing limits the model.",
     lambda e: e.tokenizer.busy_s),
    ("embedx_tokenizer_collect_seconds_total", "counter",
     "Time spent taking token ids out of tokenizer calls; near the uptime, that limits the model.",
     lambda e: e.tokenizer.collect_s),
)  # fmt: skip
# Per model and device: (metric, kind, help, value of the device's report).
DEVICE_FAMILIES: tuple[tuple[str, str, str, Callable[[DeviceReport], Any]], ...] = (
    ("embedx_device_tokens_total", "counter", "Tokens a device embedded.", lambda d: d.tokens),
    ("embedx_device_batches_total", "counter", "Batches a device ran.", lambda d: d.batches),
    ("embedx_device_busy_seconds_total", "counter", "Device time spent on batches.",
     lambda d: d.busy_s),
    ("embedx_device_budget_tokens", "gauge", "A device's token budget per batch.",
     lambda d: d.budget_tokens),
    ("embedx_device_up", "gauge", "1 while a device serves, 0 once quarantined.",
     lambda d: int(d.up)),
    ("embedx_batch_tokens", "histogram", "Real tokens per batch.", lambda d: d.batch_tokens),
    ("embedx_batch_items", "histogram", "Texts (or pairs) per batch.", lambda d: d.batch_items),
)  # fmt: skip


class ServerCollector(Collector):
    """Every embedx metric, read when Prometheus scrapes: nothing is copied in between."""

    def __init__(
        self, http: HttpMetrics, tei: TeiMetrics, registry: ModelRegistry, admission: Admission
    ) -> None:
        self.http = http
        self.tei = tei
        self.registry = registry
        self.admission = admission

    def collect(self) -> Iterator[Metric]:
        http = self.http
        requests = _family(
            "embedx_requests_total",
            "counter",
            "HTTP requests by route, method and status.",
            ("route", "method", "status"),
        )
        for (route, method, status), count in sorted(http.requests.items()):
            _add(requests, (route, method, str(status)), count)
        yield requests
        errors = _family(
            "embedx_request_errors_total",
            "counter",
            "HTTP responses with status 400 or above, by the error's code (queue_timeout, "
            "no_device_available, ...); not 499, a client that left before its answer.",
            ("route", "status", "code"),
        )
        for (route, status, code), count in sorted(http.errors.items()):
            _add(errors, (route, str(status), code), count)
        yield errors
        latency = _family(
            "embedx_request_seconds", "histogram", "HTTP request latency by route.", ("route",)
        )
        for route, histogram in sorted(http.latency.items()):
            _add(latency, (route,), histogram)
        yield latency

        yield _single(
            "embedx_requests_running",
            "gauge",
            "Requests admitted to embed or score, holding their inputs.",
            self.admission.running,
        )
        yield _single(
            "embedx_requests_waiting",
            "gauge",
            "Requests waiting for their inputs' turn (EMBEDX_MAX_INPUTS_IN_FLIGHT).",
            self.admission.waiting,
        )
        yield _single(
            "embedx_inputs_in_flight",
            "gauge",
            "Inputs (texts, pairs) the admitted requests hold.",
            self.admission.inputs.held,
        )

        registry = self.registry.report()
        yield _single(
            "embedx_models_loaded", "gauge", "Models resident or loading.", registry.models
        )
        yield _single(
            "embedx_model_weights_loaded",
            "gauge",
            "Copies of weights resident or loading, which models over one source share "
            "(what EMBEDX_MAX_LOADED_MODELS counts).",
            registry.weights,
        )
        yield _single(
            "embedx_model_load_seconds",
            "histogram",
            "Time to load a model, smoke test included.",
            registry.load_seconds,
        )
        failures = _family(
            "embedx_model_load_failures_total",
            "counter",
            "Failed model loads by error code.",
            ("code",),
        )
        for code, count in sorted(registry.load_failures.items()):
            _add(failures, (code,), count)
        yield failures
        yield _single(
            "embedx_model_evictions_total", "counter", "Models unloaded.", registry.evictions
        )
        yield _single(
            "embedx_models_failing",
            "gauge",
            "Preloaded models whose last load failed; /health answers 503 while any is.",
            registry.failing,
        )

        for metric, kind, help_text, value in MODEL_FAMILIES:
            family = _family(metric, kind, help_text, ("model",))
            for name, report in registry.engines:
                _add(family, (name,), value(report))
            yield family
        for metric, kind, help_text, of_device in DEVICE_FAMILIES:
            family = _family(metric, kind, help_text, ("model", "device"))
            for name, report in registry.engines:
                for device in report.devices:
                    _add(family, (name, device.device), of_device(device))
            yield family
        yield from tei_families(self.tei, registry)


def tei_families(tei: TeiMetrics, registry: RegistryReport) -> Iterator[Metric]:
    """TEI's metrics, with TEI's labels: its per-request counts and times and its per-route
    counts of inputs as TEI keeps them, and aliases of embedx's figures summed over models and
    devices (TEI serves one model)."""
    for name, label, counts, help_text in (
        ("te_request_count", "method", tei.requests, "Requests: single (one input) or batch."),
        ("te_request_success", "method", tei.successes, "Requests answered."),
        ("te_request_failure", "err", tei.failures, "Requests failed, by TEI's reason."),
    ):
        family = _family(name, "untyped", help_text, (label,))
        for value, count in sorted(counts.items()):
            _add(family, (value,), count)
        yield family
    # TEI's per-route counts, of inputs: it runs each input of a request on its own
    for name, count, help_text in (
        ("te_embed_count", tei.inputs["embed"], "Texts handed to an embedding model."),
        ("te_embed_success", tei.answered["embed"], "Texts an embedding model answered."),
        ("te_predict_count", tei.inputs["predict"], "Texts or pairs handed to a scorer."),
        ("te_predict_success", tei.answered["predict"], "Texts or pairs a scorer answered."),
    ):
        yield _single(name, "untyped", help_text, count)
    yield _single("te_request_duration", "histogram", "A request's embed or score call, whole.",
                  tei.duration)  # fmt: skip
    yield _single("te_request_tokenization_duration", "histogram",
                  "A request's tokenizing (and submitting).", tei.tokenization)  # fmt: skip
    yield _single("te_request_inference_duration", "histogram",
                  "A request's time from tokenized to done, its queueing included.",
                  tei.inference)  # fmt: skip
    engines = [report for _, report in registry.engines]
    devices = [device for report in engines for device in report.devices]
    merged = Histogram.merged
    yield _single("te_request_queue_duration", "histogram",
                  "As embedx_queue_wait_seconds: a batch's oldest text, queued to claimed.",
                  merged((e.queue_wait for e in engines), LATENCY_BUCKETS_S))  # fmt: skip
    yield _single("te_request_input_length", "histogram", "As embedx_input_tokens.",
                  merged((e.input_tokens for e in engines), INPUT_TOKEN_BUCKETS))  # fmt: skip
    yield _single("te_queue_size", "gauge", "As embedx_queue_items.",
                  sum(e.queue_items for e in engines))  # fmt: skip
    yield _single("te_batch_next_size", "histogram", "As embedx_batch_items.",
                  merged((d.batch_items for d in devices), BATCH_ITEM_BUCKETS))  # fmt: skip
    yield _single("te_batch_next_tokens", "histogram", "As embedx_batch_tokens.",
                  merged((d.batch_tokens for d in devices), TOKEN_BUCKETS))  # fmt: skip


def metrics_registry(
    http: HttpMetrics, tei: TeiMetrics, registry: ModelRegistry, admission: Admission
) -> CollectorRegistry:
    """The app's own registry of metrics (not prometheus_client's process-wide one), holding
    the one collector."""
    metrics = CollectorRegistry(auto_describe=False)
    metrics.register(ServerCollector(http, tei, registry, admission))
    return metrics


def exposition(metrics: CollectorRegistry) -> bytes:
    """The metrics in Prometheus' text format, version 0.0.4 (`CONTENT_TYPE`)."""
    return generate_latest(metrics)


def _family(name: str, kind: str, help_text: str, labels: tuple[str, ...]) -> Metric:
    return KINDS[kind](name, help_text, labels=labels)


def _single(name: str, kind: str, help_text: str, value: float | Histogram) -> Metric:
    family = _family(name, kind, help_text, ())
    _add(family, (), value)
    return family


def _add(family: Metric, labels: tuple[str, ...], value: float | Histogram) -> None:
    if isinstance(value, Histogram):
        assert isinstance(family, HistogramMetricFamily), "a histogram's value is a Histogram"
        family.add_metric(list(labels), _buckets(value), value.total)
    else:
        assert isinstance(family, CounterMetricFamily | GaugeMetricFamily | UnknownMetricFamily), (
            family
        )
        family.add_metric(list(labels), value)


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    """The histogram's cumulative counts, by upper bound as the exposition writes it."""
    buckets = []
    cumulative = 0
    for bound, count in zip(histogram.bounds, histogram.counts, strict=False):
        cumulative += count
        buckets.append((f"{bound:g}", float(cumulative)))
    buckets.append(("+Inf", float(histogram.count)))
    return buckets
