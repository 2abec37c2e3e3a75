"""What an engine reports of itself: typed snapshots for /metrics, and their /info form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from embedx.telemetry import Histogram

if TYPE_CHECKING:
    from embedx.engine.engine import Engine
    from embedx.engine.worker import DeviceWorker


@dataclass(frozen=True, slots=True)
class DeviceReport:
    """One device of a model: its health, its budget, its speed and what it has done."""

    device: str
    dtype: str | None
    state: str
    reason: str | None
    budget_tokens: int
    tokens_per_s: float
    fixed_s: float
    time_spread: float  # how far batch times stray from the speed fit: high beside a co-tenant
    tokens: int
    batches: int
    busy_s: float
    launching_s: float  # host seconds, all launches
    padding_rows: int
    graphs: int  # shapes captured as CUDA graphs at load
    graph_batches: int  # batches replayed as one of them
    batch_tokens: Histogram = field(repr=False)
    batch_items: Histogram = field(repr=False)

    @property
    def up(self) -> bool:
        return self.state == "active"

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "dtype": self.dtype,
            "state": self.state,
            "reason": self.reason,
            "budget_tokens": self.budget_tokens,
            "tokens_per_s": round(self.tokens_per_s),
            "fixed_ms": round(self.fixed_s * 1000, 3),
            "time_spread": round(self.time_spread, 3),
            "tokens": self.tokens,
            "batches": self.batches,
            "busy_s": round(self.busy_s, 3),
            "launching_s": round(self.launching_s, 4),
            "padding_rows": self.padding_rows,
            "graphs": self.graphs,
            "graph_batches": self.graph_batches,
        }


@dataclass(frozen=True, slots=True)
class TokenizerReport:
    calls: int
    texts: int
    busy_s: float  # near the uptime, tokenizing limits the model
    collect_s: float  # taking ids out of calls, on a thread of its own
    idle_s: float
    free_s: float
    cut_at_chars: int | None  # a text longer than this is read a window at a time
    read_at_most_chars: int  # the widest window: what a text ever costs the tokenizer
    cut: int  # texts read a window only
    cut_at_bound: int  # texts read to the widest window, counted as truncated

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "texts": self.texts,
            "busy_s": round(self.busy_s, 3),
            "collect_s": round(self.collect_s, 3),
            "idle_s": round(self.idle_s, 3),
            "free_s": round(self.free_s, 3),
            "cut_at_chars": self.cut_at_chars,
            "read_at_most_chars": self.read_at_most_chars,
            "cut": self.cut,
            "cut_at_bound": self.cut_at_bound,
        }


@dataclass(frozen=True, slots=True)
class EngineReport:
    """One model on its devices."""

    model: str
    state: str
    task: str  # embed, or score: (query, document) pairs
    labels: tuple[str, ...]  # a scorer's, in the order of its rows
    pooling: str | None  # an embedding model's
    implementation: str | None
    dimensions: int
    max_seq_len: int
    normalizes: bool
    source: str
    revision: str | None
    truncated_inputs: int
    requests: int
    queue_items: int
    queue_tokens: int
    padding_tokens: int
    queue_wait: Histogram = field(repr=False)  # a batch's oldest text, queued to claimed
    latency: Histogram = field(repr=False)  # an embed call to its vectors
    input_tokens: Histogram = field(repr=False)  # each text's tokens, after truncation
    tokenizer: TokenizerReport = field(repr=False)
    devices: list[DeviceReport] = field(default_factory=list)
    skipped_devices: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "state": self.state,
            "task": self.task,
            **({"labels": list(self.labels)} if self.task == "score" else {}),
            "pooling": self.pooling,
            "implementation": self.implementation,
            "dimensions": self.dimensions,
            "max_seq_len": self.max_seq_len,
            "normalizes": self.normalizes,
            "source": self.source,
            "revision": self.revision,
            "truncated_inputs": self.truncated_inputs,
            "requests": self.requests,
            "queue": {"items": self.queue_items, "tokens": self.queue_tokens},
            "tokenizer": self.tokenizer.as_dict(),
            "devices": [device.as_dict() for device in self.devices],
            "skipped_devices": self.skipped_devices,
        }


def report_of(engine: Engine) -> EngineReport:
    tokenizer = engine.tokenizer
    return EngineReport(
        model=engine.spec.name,
        state=engine.state.value,
        task=engine.task.kind,
        labels=engine.task.labels,
        pooling=engine.pooling.value if engine.pooling is not None else None,
        implementation=engine.replicas[0].model.implementation if engine.replicas else None,
        dimensions=engine.dimensions,
        max_seq_len=tokenizer.max_seq_len,
        normalizes=engine.files.normalizes,
        source=engine.files.origin,
        revision=engine.files.revision,
        truncated_inputs=engine.truncated,
        requests=engine.requests,
        queue_items=engine.queue.pending_items,
        queue_tokens=engine.queue.pending_tokens,
        padding_tokens=engine.queue.padding_tokens,
        queue_wait=engine.queue.queue_wait,
        latency=engine.latency,
        input_tokens=engine.input_tokens,
        tokenizer=TokenizerReport(
            calls=tokenizer.calls,
            texts=tokenizer.texts,
            busy_s=tokenizer.busy_s,
            collect_s=tokenizer.collect_s,
            idle_s=tokenizer.idle_seconds(),
            free_s=tokenizer.free_s,
            cut_at_chars=tokenizer.windows.cut_at,
            read_at_most_chars=tokenizer.windows.read_at_most,
            cut=tokenizer.windows.cut,
            cut_at_bound=tokenizer.windows.cut_at_bound,
        ),
        devices=[_device_report(engine, worker) for worker in engine.workers],
        skipped_devices=dict(engine.skipped),
    )


def _device_report(engine: Engine, worker: DeviceWorker) -> DeviceReport:
    slot = worker.slot
    return DeviceReport(
        device=slot.name,
        dtype=engine.dtypes.get(slot.name),
        state=slot.state.value,
        reason=slot.reason,
        budget_tokens=slot.budget,
        tokens_per_s=slot.speed.rate,
        fixed_s=slot.speed.fixed,
        time_spread=slot.speed.spread,
        tokens=slot.tokens_done,
        batches=slot.batches_done,
        busy_s=slot.busy_s,
        launching_s=slot.launching_s,
        padding_rows=worker.padding_rows,
        graphs=len(worker.replica.graphs or ()),
        graph_batches=worker.graph_batches,
        batch_tokens=worker.batch_tokens,
        batch_items=worker.batch_items,
    )
