"""Which models are resident: each name's record (users, keep-alive, idle timer), the copy of
weights it shares with the names over the same source, and which idle copy gives its slot up
when another needs it."""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from embedx.errors import ModelsBusy
from embedx.models.catalog import ModelSpec

if TYPE_CHECKING:
    from embedx.engine import Engine, NamedEngine
    from embedx.models.pooling import Pooling

FOREVER = math.inf  # the keep-alive of a preloaded model: never idled out or evicted

# What a name's loaded weights and engine are made of: names that agree on it share one copy.
# Pooling is among them because the forward pools (for CLS and last-token pooling the last
# layer runs only for the pooled token) and the probe sizes batches for that forward.
WeightsKey = tuple[str, str | None, str, int | None, "Pooling | None", str]


def weights_key(spec: ModelSpec) -> WeightsKey:
    return (spec.source, spec.revision, spec.dtype, spec.max_seq_len, spec.pooling,
            spec.implementation)  # fmt: skip


class Weights:
    """One resident copy of a model's weights: its engine (loading or loaded, on every device
    it fits) and the names it serves, in the order they came."""

    __slots__ = ("engine", "id", "key", "names", "task")

    def __init__(self, key: WeightsKey) -> None:
        self.key = key
        # /info's name for the copy: one per key, and no directory of the server's in it
        self.id = hashlib.sha256(repr(key).encode(errors="surrogateescape")).hexdigest()[:12]
        self.names: dict[str, Resident] = {}
        self.engine: Engine | None = None
        self.task: asyncio.Task[Engine] | None = None

    @property
    def evictable(self) -> bool:
        """Loaded, and every name of it evictable."""
        return self.engine is not None and all(r.evictable for r in self.names.values())

    @property
    def last_used(self) -> float:
        return max((r.last_used for r in self.names.values()), default=-math.inf)


class Resident:
    """A model name in the registry, over its copy of the weights (loading or loaded), with its
    users and idle timer."""

    __slots__ = ("_named", "keep_alive_s", "last_used", "spec", "timer", "users", "weights")

    def __init__(self, spec: ModelSpec, weights: Weights, keep_alive_s: float, now: float) -> None:
        self.spec = spec
        self.weights = weights
        self.keep_alive_s = keep_alive_s
        self.users = 0
        self.last_used = now
        self.timer: asyncio.TimerHandle | None = None
        self._named: NamedEngine | None = None

    @property
    def engine(self) -> Engine | None:
        return self.weights.engine

    @property
    def task(self) -> asyncio.Task[Engine] | None:
        return self.weights.task

    @property
    def named(self) -> NamedEngine:
        """The loaded engine under this name, with its prompts."""
        from embedx.engine import NamedEngine

        engine = self.weights.engine
        assert engine is not None, "a name is leased once its weights are loaded"
        if self._named is None or self._named.engine is not engine:
            self._named = NamedEngine(self.spec, engine)
        return self._named

    @property
    def evictable(self) -> bool:
        """Loaded, held by no request, and not kept for the server's life."""
        return self.users == 0 and self.engine is not None and self.keep_alive_s != FOREVER

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Residency:
    """The names resident and the copies of weights they share, kept in step."""

    __slots__ = ("copies", "names")

    def __init__(self) -> None:
        self.names: dict[str, Resident] = {}
        self.copies: dict[WeightsKey, Weights] = {}

    def join(self, spec: ModelSpec, weights: Weights, keep_alive_s: float, now: float) -> Resident:
        """The name of `spec`, resident over `weights` (a copy held here)."""
        resident = Resident(spec, weights, keep_alive_s, now)
        weights.names[spec.name] = self.names[spec.name] = resident
        return resident

    def leave(self, resident: Resident) -> Engine | None:
        """Forget the name, and its copy of weights once no other name has it: then that
        copy's engine, to close."""
        resident.stop_timer()
        weights = resident.weights
        del self.names[resident.spec.name], weights.names[resident.spec.name]
        if weights.names:
            return None
        del self.copies[weights.key]
        engine, weights.engine = weights.engine, None
        assert engine is not None, "only a loaded copy is evicted"
        return engine

    def failed(self, weights: Weights) -> None:
        """Forget a copy whose load failed, and the names over it."""
        if self.copies.get(weights.key) is weights:
            del self.copies[weights.key]
        for name, resident in weights.names.items():
            if self.names.get(name) is resident:
                del self.names[name]

    def clear(self) -> list[Weights]:
        """Forget everything (the registry drains): the copies that were held."""
        copies = list(self.copies.values())
        for resident in self.names.values():
            resident.stop_timer()
        self.names.clear()
        self.copies.clear()
        return copies


def least_recently_used(
    copies: Iterable[Weights], sparing: Weights | None = None
) -> Weights | None:
    """The evictable copy of weights whose names have been idle the longest (not `sparing`),
    if there is one."""
    idle = [w for w in copies if w is not sparing and w.evictable]
    return min(idle, key=lambda w: w.last_used) if idle else None


def no_room(copies: list[Weights]) -> ModelsBusy:
    """Why a model cannot load with every slot held by a copy of weights that stays."""
    if all(any(r.keep_alive_s == FOREVER for r in w.names.values()) for w in copies):
        return ModelsBusy(
            f"{len(copies)} models are resident (EMBEDX_MAX_LOADED_MODELS), all preloaded "
            "(EMBEDX_PRELOAD), which stay: ask for one of them, or the operator raises the cap",
            retry=False,
        )
    return ModelsBusy(
        f"{len(copies)} models are resident (EMBEDX_MAX_LOADED_MODELS) and all are in use, "
        "loading or preloaded; try again shortly"
    )
