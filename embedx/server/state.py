"""What the routes and the guard share: settings, the registry, admission, counters, and which
requests are in flight."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from embedx.server.admission import Admission, Budget
from embedx.server.http_metrics import HttpMetrics
from embedx.server.metrics import metrics_registry
from embedx.server.tei_metrics import TeiMetrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from embedx.config import Settings
    from embedx.devices import DeviceInfo
    from embedx.registry import ModelRegistry


@dataclass(slots=True)
class ServerState:
    settings: Settings
    registry: ModelRegistry
    devices: list[DeviceInfo]
    admission: Admission
    http: HttpMetrics = field(default_factory=HttpMetrics)
    tei: TeiMetrics = field(default_factory=TeiMetrics)
    started_at: float = field(default_factory=time.time)
    draining: bool = False
    # the tasks of HTTP requests whose body is in, until their response: the work a stop
    # drains, and ends if it cannot wait for it
    requests: set[asyncio.Task[Any]] = field(default_factory=set)
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while none is in flight
    # the tasks of HTTP requests still waiting for their body's bytes of the budget, or for
    # the body itself: no work yet, so a stop ends them at once
    receiving: set[asyncio.Task[Any]] = field(default_factory=set)
    bodies: Budget = field(init=False)
    metrics: CollectorRegistry = field(init=False)  # /metrics', read at scrape time

    def __post_init__(self) -> None:
        self.idle.set()
        self.bodies = Budget(
            self.settings.max_body_bytes_in_flight,
            self.settings.request_queue_timeout_s,
            "bytes",
            "EMBEDX_MAX_BODY_BYTES_IN_FLIGHT",
        )
        self.metrics = metrics_registry(self.http, self.tei, self.registry, self.admission)

    @property
    def in_flight(self) -> int:
        return len(self.requests)

    def receiving_body(self, request: asyncio.Task[Any]) -> None:
        """A request arrived: until its body is in, a stop ends it at once."""
        self.receiving.add(request)

    def working(self, request: asyncio.Task[Any]) -> None:
        """A request's body is in: its work is in flight, which a stop drains."""
        self.receiving.discard(request)
        self.requests.add(request)
        self.idle.clear()

    def done(self, request: asyncio.Task[Any]) -> None:
        """A request was answered (or its client left, or it failed)."""
        self.receiving.discard(request)
        self.requests.discard(request)
        if not self.requests:
            self.idle.set()

    def stop_taking(self) -> None:
        """Refuse new requests, and end those whose body has not arrived (each gets a 503):
        a client sending its body slowly, or never, must not hold the drain."""
        self.draining = True
        for request in list(self.receiving):
            request.cancel()
