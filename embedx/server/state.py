"""What the routes share: settings, the registry, admission, counters, lifecycle."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from embedx.server.admission import Admission, ByteBudget
from embedx.server.metrics import HttpMetrics

if TYPE_CHECKING:
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
    started_at: float = field(default_factory=time.time)
    draining: bool = False
    # the tasks of HTTP requests whose body is in, until their response: the work a stop
    # drains, and ends if it cannot wait for it
    requests: set[asyncio.Task[Any]] = field(default_factory=set)
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while none is in flight
    # the tasks of HTTP requests still waiting for their body's bytes of the budget, or for
    # the body itself: no work yet, so a stop ends them at once
    receiving: set[asyncio.Task[Any]] = field(default_factory=set)
    bodies: ByteBudget = field(init=False)

    def __post_init__(self) -> None:
        self.idle.set()
        self.bodies = ByteBudget(
            self.settings.max_body_bytes_in_flight, self.settings.request_queue_timeout_s
        )

    @property
    def in_flight(self) -> int:
        return len(self.requests)

    def stop_taking(self) -> None:
        """Refuse new requests, and end those whose body has not arrived (each gets a 503):
        a client sending its body slowly, or never, must not hold the drain."""
        self.draining = True
        for request in list(self.receiving):
            request.cancel()
