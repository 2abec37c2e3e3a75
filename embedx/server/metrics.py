"""/metrics: one Prometheus collector, read at scrape time, over the guard's HTTP counts,
admission and the registry's snapshot (its models' engine reports among it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from embedx.telemetry import Histogram

if TYPE_CHECKING:
    from embedx.engine.report import DeviceReport, EngineReport
    from embedx.registry import ModelRegistry
    from embedx.server.admission import Admission
    from embedx.server.http_metrics import HttpMetrics

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
# A family's kind, and the class that holds its samples.
KINDS: dict[str, Callable[..., Metric]] = {
    "counter": CounterMetricFamily,
    "gauge": GaugeMetricFamily,
    "histogram": HistogramMetricFamily,
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
)  # fmt: skip


class ServerCollector(Collector):
    """Every embedx metric, read when Prometheus scrapes: nothing is copied in between."""

    def __init__(self, http: HttpMetrics, registry: ModelRegistry, admission: Admission) -> None:
        self.http = http
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
            "Embedding requests holding a slot.",
            self.admission.running,
        )
        yield _single(
            "embedx_requests_waiting",
            "gauge",
            "Embedding requests waiting for a slot.",
            self.admission.waiting,
        )

        registry = self.registry.report()
        yield _single(
            "embedx_models_loaded", "gauge", "Models resident or loading.", registry.models
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


def metrics_registry(
    http: HttpMetrics, registry: ModelRegistry, admission: Admission
) -> CollectorRegistry:
    """The app's own registry of metrics (not prometheus_client's process-wide one), holding
    the one collector."""
    metrics = CollectorRegistry(auto_describe=False)
    metrics.register(ServerCollector(http, registry, admission))
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
        assert isinstance(family, CounterMetricFamily | GaugeMetricFamily), family
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
