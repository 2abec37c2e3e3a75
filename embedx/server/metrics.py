"""Prometheus text for /metrics: HTTP counters kept here, engine and registry figures read live."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from embedx.telemetry import LATENCY_BUCKETS_S, Histogram

if TYPE_CHECKING:
    from embedx.registry import ModelRegistry
    from embedx.server.admission import Admission


class HttpMetrics:
    """Requests and errors by route, method and status; latency by route."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str, int]] = Counter()
        self.latency: dict[str, Histogram] = {}

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests[(route, method, status)] += 1
        histogram = self.latency.get(route)
        if histogram is None:
            histogram = self.latency[route] = Histogram(LATENCY_BUCKETS_S)
        histogram.observe(seconds)


def _labels(**labels: object) -> str:
    inner = ",".join(
        f'{k}="{str(v).replace(chr(92), "/").replace(chr(34), "")}"' for k, v in labels.items()
    )
    return "{" + inner + "}" if inner else ""


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, **labels: object) -> None:
        self.lines.append(f"{name}{_labels(**labels)} {value:g}")

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
    w.family("embedx_request_errors_total", "counter", "HTTP responses with status 400 or above.")
    errors: Counter[tuple[str, int]] = Counter()
    for (route, _, status), count in http.requests.items():
        if status >= 400:
            errors[(route, status)] += count
    for (route, status), count in sorted(errors.items()):
        w.sample("embedx_request_errors_total", count, route=route, status=status)
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
    w.histogram("embedx_model_load_seconds", registry.load_seconds)
    w.family("embedx_model_evictions_total", "counter", "Models unloaded.")
    w.sample("embedx_model_evictions_total", registry.evictions)

    engines = [(r.spec.name, r.engine) for r in registry.residents() if r.engine is not None]
    _queue_families(w, engines)
    return "\n".join(w.lines) + "\n"


def _queue_families(w: _Writer, engines: Iterable[tuple[str, object]]) -> None:
    from embedx.engine import Engine

    live = [(name, e) for name, e in engines if isinstance(e, Engine)]
    w.family("embedx_queue_items", "gauge", "Texts waiting in a model's queue.")
    for name, engine in live:
        w.sample("embedx_queue_items", engine.queue.pending_items, model=name)
    w.family("embedx_queue_tokens", "gauge", "Tokens waiting in a model's queue.")
    for name, engine in live:
        w.sample("embedx_queue_tokens", engine.queue.pending_tokens, model=name)
    w.family("embedx_queue_wait_seconds", "histogram", "From submission to a batch's start.")
    for name, engine in live:
        w.histogram("embedx_queue_wait_seconds", engine.queue.queue_wait, model=name)
    w.family("embedx_padding_tokens_total", "counter", "Padded minus real tokens of batches cut.")
    for name, engine in live:
        w.sample("embedx_padding_tokens_total", engine.queue.padding_tokens, model=name)
    w.family("embedx_truncated_inputs_total", "counter", "Texts cut to the model's length.")
    for name, engine in live:
        w.sample("embedx_truncated_inputs_total", engine.truncated, model=name)
    families = (
        ("embedx_device_tokens_total", "counter", "Tokens a device embedded.", "tokens_done"),
        ("embedx_device_batches_total", "counter", "Batches a device ran.", "batches_done"),
        ("embedx_device_busy_seconds_total", "counter", "Device time spent on batches.", "busy_s"),
        ("embedx_device_budget_tokens", "gauge", "A device's token budget per batch.", "budget"),
    )
    for metric, kind, help_text, attribute in families:
        w.family(metric, kind, help_text)
        for name, engine in live:
            for worker in engine.workers:
                value = getattr(worker.slot, attribute)
                w.sample(metric, value, model=name, device=worker.slot.name)
    w.family("embedx_device_up", "gauge", "1 while a device serves, 0 once quarantined.")
    for name, engine in live:
        for worker in engine.workers:
            w.sample(
                "embedx_device_up", int(worker.slot.active), model=name, device=worker.slot.name
            )
    w.family("embedx_batch_tokens", "histogram", "Real tokens per batch.")
    for name, engine in live:
        for worker in engine.workers:
            w.histogram(
                "embedx_batch_tokens", worker.batch_tokens, model=name, device=worker.slot.name
            )
