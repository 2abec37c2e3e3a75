"""Prometheus text for /metrics: HTTP counters kept here, engine and registry figures read live."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from embedx.telemetry import LATENCY_BUCKETS_S, Histogram

if TYPE_CHECKING:
    from embedx.engine.report import DeviceReport, EngineReport
    from embedx.registry import ModelRegistry
    from embedx.server.admission import Admission


# Methods counted by name; any other is "other", as unknown paths are: a client sending
# made-up methods must not grow the series without bound.
COUNTED_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
# The status recorded for a request whose client hung up before its response (nginx's):
# counted as a request, not as an error of the server's.
CLIENT_CLOSED = 499


class HttpMetrics:
    """Requests by route, method and status; errors by route, status and code; latency by
    route."""

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


def _labels(**labels: object) -> str:
    inner = ",".join(f'{k}="{_escaped(str(v))}"' for k, v in labels.items())
    return "{" + inner + "}" if inner else ""


def _escaped(value: str) -> str:
    """A label value as the exposition format writes it: backslash, quote and newline
    escaped (model names are paths and catalog keys: any of them can appear)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """Every digit: a counter past a million printed with six would stop moving in small
    steps, and rate() over it would read as steps or zero."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, **labels: object) -> None:
        self.lines.append(f"{name}{_labels(**labels)} {_number(value)}")

    def value(self, name: str, kind: str, value: Any, **labels: object) -> None:
        if kind == "histogram":
            self.histogram(name, value, **labels)
        else:
            self.sample(name, value, **labels)

    def histogram(self, name: str, histogram: Histogram, **labels: object) -> None:
        cumulative = 0
        for bound, count in zip(histogram.bounds, histogram.counts, strict=False):
            cumulative += count
            self.sample(f"{name}_bucket", cumulative, **labels, le=f"{bound:g}")
        self.sample(f"{name}_bucket", histogram.count, **labels, le="+Inf")
        self.sample(f"{name}_sum", histogram.total, **labels)
        self.sample(f"{name}_count", histogram.count, **labels)


def render(http: HttpMetrics, registry: ModelRegistry, admission: Admission) -> str:
    w = _Writer()
    w.family("embedx_requests_total", "counter", "HTTP requests by route, method and status.")
    for (route, method, status), count in sorted(http.requests.items()):
        w.sample("embedx_requests_total", count, route=route, method=method, status=status)
    w.family(
        "embedx_request_errors_total",
        "counter",
        "HTTP responses with status 400 or above, by the error's code (queue_timeout, "
        "no_device_available, ...); not 499, a client that left before its answer.",
    )
    for (route, status, code), count in sorted(http.errors.items()):
        w.sample("embedx_request_errors_total", count, route=route, status=status, code=code)
    w.family("embedx_request_seconds", "histogram", "HTTP request latency by route.")
    for route, histogram in sorted(http.latency.items()):
        w.histogram("embedx_request_seconds", histogram, route=route)

    w.family("embedx_requests_running", "gauge", "Embedding requests holding a slot.")
    w.sample("embedx_requests_running", admission.running)
    w.family("embedx_requests_waiting", "gauge", "Embedding requests waiting for a slot.")
    w.sample("embedx_requests_waiting", admission.waiting)

    w.family("embedx_models_loaded", "gauge", "Models resident or loading.")
    w.sample("embedx_models_loaded", len(registry.residents()))
    w.family("embedx_model_load_seconds", "histogram", "Time to load a model, smoke test included.")
    w.histogram("embedx_model_load_seconds", registry.loads.seconds)
    w.family("embedx_model_load_failures_total", "counter", "Failed model loads by error code.")
    for code, count in sorted(registry.loads.failures.items()):
        w.sample("embedx_model_load_failures_total", count, code=code)
    w.family("embedx_model_evictions_total", "counter", "Models unloaded.")
    w.sample("embedx_model_evictions_total", registry.evictions)
    w.family(
        "embedx_models_failing",
        "gauge",
        "Preloaded models whose last load failed; /health answers 503 while any is.",
    )
    w.sample("embedx_models_failing", len(registry.failing()))

    reports = [(r.spec.name, r.engine.report()) for r in registry.residents() if r.engine]
    _engine_families(w, reports)
    return "\n".join(w.lines) + "\n"


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


def _engine_families(w: _Writer, reports: list[tuple[str, EngineReport]]) -> None:
    for metric, kind, help_text, value in MODEL_FAMILIES:
        w.family(metric, kind, help_text)
        for name, report in reports:
            w.value(metric, kind, value(report), model=name)
    for metric, kind, help_text, of_device in DEVICE_FAMILIES:
        w.family(metric, kind, help_text)
        for name, report in reports:
            for device in report.devices:
                w.value(metric, kind, of_device(device), model=name, device=device.device)
