"""What the routes share: settings, the registry, admission, counters, lifecycle."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from embedx.server.admission import Admission
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
    # the tasks of HTTP requests between the edge and their response: counted, and ended
    # by a stop that cannot wait for them (a body that stopped arriving)
    requests: set[asyncio.Task[Any]] = field(default_factory=set)
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while none is in flight

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def in_flight(self) -> int:
        return len(self.requests)
