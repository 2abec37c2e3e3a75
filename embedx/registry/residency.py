"""Which models hold a residency slot: each one's users, keep-alive and idle timer, and which
idle one gives its slot up when another needs it."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from embedx.errors import ModelsBusy
from embedx.models.catalog import ModelSpec

if TYPE_CHECKING:
    from embedx.engine import Engine

FOREVER = math.inf  # the keep-alive of a preloaded model: never idled out or evicted


class Resident:
    """A model in the registry: loading or loaded, with its users and idle timer."""

    __slots__ = ("engine", "keep_alive_s", "last_used", "spec", "task", "timer", "users")

    def __init__(self, spec: ModelSpec, keep_alive_s: float, now: float) -> None:
        self.spec = spec
        self.keep_alive_s = keep_alive_s
        self.users = 0
        self.last_used = now
        self.engine: Engine | None = None
        self.task: asyncio.Task[Engine] | None = None
        self.timer: asyncio.TimerHandle | None = None

    @property
    def evictable(self) -> bool:
        """Loaded, held by no request, and not kept for the server's life."""
        return self.users == 0 and self.engine is not None and self.keep_alive_s != FOREVER

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def least_recently_used(
    residents: Iterable[Resident], sparing: Resident | None = None
) -> Resident | None:
    """The evictable model idle the longest (not `sparing`), if there is one."""
    idle = [r for r in residents if r is not sparing and r.evictable]
    return min(idle, key=lambda r: r.last_used) if idle else None


def no_room(residents: list[Resident]) -> ModelsBusy:
    """Why a model cannot load with every slot held by a model that stays."""
    if all(r.keep_alive_s == FOREVER for r in residents):
        return ModelsBusy(
            f"{len(residents)} models are resident (EMBEDX_MAX_LOADED_MODELS), all preloaded "
            "(EMBEDX_PRELOAD), which stay: ask for one of them, or the operator raises the cap",
            retry=False,
        )
    return ModelsBusy(
        f"{len(residents)} models are resident (EMBEDX_MAX_LOADED_MODELS) and all are in use, "
        "loading or preloaded; try again shortly"
    )
