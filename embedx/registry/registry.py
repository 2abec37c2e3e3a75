"""ModelRegistry: loads a model on first use (once, however many ask; one copy of the weights
for every name over the same source), keeps it while it is used, and unloads it after its
keep-alive or when the residency cap needs its room."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from embedx import heap
from embedx.config import Settings
from embedx.engine import Engine, NamedEngine
from embedx.errors import (
    EmbedxError,
    InvalidOption,
    ModelNotFound,
    ShuttingDown,
)
from embedx.models.catalog import ModelSpec, check_dtype
from embedx.registry import report
from embedx.registry.failures import (
    FAILED_LOAD_MEMORY_S,
    FailedLoads,
    remembered,
)
from embedx.registry.loading import Loads
from embedx.registry.naming import LoadRequest, Names, asked_length, asked_pooling
from embedx.registry.report import RegistryReport
from embedx.registry.residency import (
    FOREVER,
    Residency,
    Resident,
    Weights,
    least_recently_used,
    no_room,
    weights_key,
)

if TYPE_CHECKING:
    from embedx.devices import Accelerator, DeviceInfo

log = logging.getLogger("embedx.registry")
# A preloaded model's load: no request says what it is for; its files do (a pooling is needed
# only where it embeds, which its load finds out).
PRELOADED = LoadRequest(task=None)


class ModelRegistry:
    def __init__(
        self,
        settings: Settings,
        catalog: dict[str, ModelSpec],
        devices: Sequence[DeviceInfo],
        open_accelerator: Callable[[DeviceInfo], Accelerator],
        *,
        local_paths: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.names = Names(settings, catalog, local_paths=local_paths)
        self.catalog = catalog
        self.clock = clock
        self.devices = list(devices)
        self.loads = Loads(settings, devices, open_accelerator, clock)
        self._residency = Residency()
        self._models = self._residency.names  # by name
        self._weights = self._residency.copies  # the copies of weights the names share
        self._closing = False
        self._unloading: set[asyncio.Task[None]] = set()  # evicted engines still closing
        self._preloaded: set[str] = set()  # EMBEDX_PRELOAD's, kept loaded (FOREVER)
        self._failed = FailedLoads(clock, FAILED_LOAD_MEMORY_S)
        # models kept for the server's life whose last load failed, with why
        self._failing: dict[str, str] = {}
        self.evictions = 0

    # -- leases --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lease(
        self, name: str, request: LoadRequest | None = None
    ) -> AsyncIterator[NamedEngine]:
        """The model's engine under its name, loaded if need be, held (not evicted) until the
        block exits."""
        resident = await self._acquire(name, request or LoadRequest())
        try:
            yield resident.named
        finally:
            self._release(resident)

    async def _acquire(self, asked: str, request: LoadRequest) -> Resident:
        if self._closing:
            raise ShuttingDown("the server is shutting down")
        name, directory = self.names.served_as(asked)
        if name not in self._models:
            self._failed.check(name)
            spec = self.names.spec_for(asked, request)
            if directory is not None:
                spec = spec.with_overrides(name=name, source=str(directory))
            unpooled = spec.pooling is None and request.task == "embed"
            full = (
                weights_key(spec) not in self._weights
                and len(self._weights) >= self.settings.max_loaded_models
            )
            if unpooled or full:
                # A name that leads nowhere (a typo, an OpenAI model's) is a 404: not a request
                # to state how a model that does not exist pools, nor a reason to evict one
                # that does. (Below the cap nothing is evicted: its load finds out, and the
                # first requests are not held up by a lookup.)
                found = await asyncio.to_thread(self.names.look_up, asked, spec)
                if unpooled:
                    raise self.names.pooling_required(asked, found)
                if self._closing:
                    raise ShuttingDown("the server is shutting down")
            if name not in self._models:  # no other request started it while this one looked
                if directory is not None:  # its name, for the operator: no client sees this
                    log.info("%s is the directory %s", name, directory)
                self._reserve(spec)
        resident = self._models[name]
        if request.dtype is not None:  # ignored once it is loaded, but never wrong
            check_dtype(request.dtype)
        asked_pooling(name, resident.spec.pooling, request.pooling)
        if resident.engine is not None and not resident.engine.serving:
            # Every device of it failed. Its requests in flight fail anyway, and the fault
            # may have passed: it loads again, as it was (its pooling and length kept).
            self._evict_weights(resident.weights, "every device of it is quarantined")
            resident = self._reserve(resident.spec)
        resident.users += 1
        resident.stop_timer()
        task = resident.task
        assert task is not None
        try:
            await asyncio.shield(task)
        except BaseException:
            self._release(resident)
            current = asyncio.current_task()
            if task.cancelled() and not (current and current.cancelling()):
                # the load, not this request, was cancelled: the server is shutting down
                raise ShuttingDown("the server shut down while the model loaded") from None
            raise
        assert resident.engine is not None
        try:  # known once loaded: the catalog's, the first request's or the model's own
            asked_length(name, resident.engine.tokenizer.max_seq_len, request.max_seq_len)
        except InvalidOption:
            self._release(resident)
            raise
        return resident

    def _reserve(self, spec: ModelSpec) -> Resident:
        """The name over the copy of weights its spec loads: a resident one is shared; else a
        slot is taken (before any await: concurrent cold loads never pass the cap), evicting
        the least recently used idle copy at the cap, and the load starts."""
        key = weights_key(spec)
        weights = self._weights.get(key)
        if weights is None:
            if len(self._weights) >= self.settings.max_loaded_models:
                victim = least_recently_used(self._weights.values())
                if victim is None:
                    raise no_room(list(self._weights.values()))
                self._evict_weights(victim, "to make room")
            weights = self._weights[key] = Weights(key)
            weights.task = asyncio.create_task(self._load(weights, spec), name=f"load-{spec.name}")
        keep_alive = spec.keep_alive_s
        if self._kept_loaded(spec.name):
            keep_alive = FOREVER  # whatever keep_alive the request that reloads it sends
        elif keep_alive is None:
            keep_alive = self.settings.default_keep_alive_s
        return self._residency.join(spec, weights, keep_alive, self.clock())

    async def _load(self, weights: Weights, spec: ModelSpec) -> Engine:
        """Load the copy of weights `spec` names, for every name that shares it meanwhile."""
        try:
            # Their memory must be free before this model takes it: one evicted to make room,
            # or unloaded a moment ago (keep_alive 0, idle) and now asked for again.
            await asyncio.gather(*self._unloading, return_exceptions=True)
            engine = await self.loads.open(spec, lambda: self._make_room(weights, spec.name))
        except BaseException as exc:
            self._residency.failed(weights)
            if isinstance(exc, EmbedxError):
                for name in weights.names:
                    self._load_failed(name, exc)
            raise
        weights.engine = engine
        for resident in list(weights.names.values()):
            self._failing.pop(resident.spec.name, None)
            self._settle_unused(resident)  # every request that waited for it may have left
        return engine

    def _load_failed(self, name: str, error: EmbedxError) -> None:
        if remembered(error):
            self._failed.remember(name, error)
        own = not isinstance(error, ShuttingDown | InvalidOption)  # not a request's options
        if own and self._kept_loaded(name) and not self._closing:
            # the server was started to serve it: it tries again with no request waiting,
            # and /health fails until it loads
            self._failing[name] = error.message
            self._load_again_later(name)

    async def _make_room(self, loading: Weights, name: str) -> bool:
        """Unload the least recently used idle copy of weights (no preloaded model's), for the
        model `name` that fits on no device beside what is loaded; False if there is none."""
        victim = least_recently_used(self._weights.values(), sparing=loading)
        if victim is None:
            return False
        self._evict_weights(victim, f"to make room for {name}")
        await asyncio.gather(*self._unloading, return_exceptions=True)
        return True

    def _release(self, resident: Resident) -> None:
        resident.users -= 1
        resident.last_used = self.clock()
        self._settle_unused(resident)

    def _settle_unused(self, resident: Resident) -> None:
        """A loaded model no request holds: unloaded now, or timed to be once idle for its
        keep-alive."""
        if resident.users or resident.engine is None or self._closing:
            return
        if self._models.get(resident.spec.name) is not resident:
            return
        if not resident.engine.serving:  # a device fault may pass: it loads again
            names = list(resident.weights.names)
            self._evict_weights(resident.weights, "every device of it is quarantined")
            for name in names:  # now if the server keeps it, else when asked
                self._load_again(name)
        elif resident.keep_alive_s <= 0:
            self._evict(resident, "keep_alive is 0")
        elif resident.keep_alive_s != FOREVER:
            resident.timer = asyncio.get_running_loop().call_later(
                resident.keep_alive_s, self._expire, resident
            )

    def _kept_loaded(self, name: str) -> bool:
        """Preloaded, and its catalog entry sets no keep-alive: loaded for the server's life."""
        return name in self._preloaded and self.catalog[name].keep_alive_s is None

    def _load_again(self, name: str) -> None:
        """Load a model kept for the server's life that lost its devices or failed to load,
        with no request waiting for it (one that comes joins the load)."""
        if not self._kept_loaded(name) or name in self._models or self._closing:
            return
        try:
            resident = self._reserve(self.names.spec_for(name, PRELOADED))
        except EmbedxError as exc:  # every slot is held by a model in use: later, then
            log.warning("%s cannot load again now: %s", name, exc.message)
            self._load_again_later(name)
            return
        assert resident.task is not None
        resident.task.add_done_callback(_seen)  # a failure is logged and tried again

    def _load_again_later(self, name: str) -> None:
        asyncio.get_running_loop().call_later(self._failed.memory_s, self._load_again, name)

    def _expire(self, resident: Resident) -> None:
        resident.timer = None
        if resident.users == 0 and self._models.get(resident.spec.name) is resident:
            self._evict(resident, f"idle for {resident.keep_alive_s:.0f} s")

    def _evict(self, resident: Resident, why: str) -> None:
        """Forget the name now, and its weights unless another name shares them: their engine
        closes in the background (`_unloading`)."""
        name = resident.spec.name
        self.evictions += 1
        # a model that lost every device is an outage: seen at the warning level too
        level = logging.INFO if resident.engine and resident.engine.serving else logging.WARNING
        engine = self._residency.leave(resident)
        if engine is None:
            shared = ", ".join(resident.weights.names)
            log.log(level, "unloading %s (%s); its weights stay, for %s", name, why, shared)
            return
        log.log(level, "unloading %s (%s)", name, why)
        task = asyncio.create_task(engine.close(), name=f"unload-{name}")
        self._unloading.add(task)
        task.add_done_callback(self._unloaded)

    def _evict_weights(self, weights: Weights, why: str) -> None:
        """Forget a copy of weights and every name over it."""
        for resident in list(weights.names.values()):
            self._evict(resident, why)

    def _unloaded(self, task: asyncio.Task[None]) -> None:
        self._unloading.discard(task)
        if self._models:  # closing unfroze the heap: freeze again what the others keep alive
            heap.freeze()

    async def preload(self, names: Sequence[str]) -> None:
        """Load catalog models now (EMBEDX_PRELOAD). They stay loaded, neither idled out nor
        evicted to make room, unless their catalog entry sets a keep_alive_s."""
        for name in names:
            if name not in self.catalog:
                raise ModelNotFound(f"EMBEDX_PRELOAD names {name!r}, which is not in the catalog")
            self._preloaded.add(name)
            async with self.lease(name, PRELOADED):
                pass

    # -- shutting down -------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> None:
        """Refuse new leases, let work in flight finish (bounded), unload everything."""
        self._closing = True
        copies = self._residency.clear()
        for weights in copies:
            if weights.task is not None and not weights.task.done():
                weights.task.cancel()
        await asyncio.gather(
            *(w.task for w in copies if w.task is not None), return_exceptions=True
        )
        engines = [w.engine for w in copies if w.engine is not None]
        await asyncio.gather(*(e.drain(timeout_s) for e in engines), *self._unloading)

    # -- reporting -----------------------------------------------------------------------

    def residents(self) -> list[Resident]:
        return list(self._models.values())

    def describe(self) -> list[dict[str, Any]]:
        """The resident models, for /info."""
        shown = self.settings.show_model_sources
        return [report.described(r, self.clock(), shown) for r in self._models.values()]

    def report(self) -> RegistryReport:
        """The registry's figures, and each loaded model's, for /metrics."""
        models, copies = self._models.values(), self._weights.values()
        failing = len(self._failing)
        return report.registry_report(models, copies, self.loads, self.evictions, failing)

    def failing(self) -> list[str]:
        """Models kept for the server's life whose last load failed: until each loads again,
        the server cannot serve what it was started to serve."""
        return sorted(self._failing)

    def degraded(self) -> list[str]:
        """Devices quarantined by any resident model, as 'model: device (reason)', and
        preloaded models not loaded (their reload failed) that their entries keep loaded."""
        found = []
        for name in sorted(self._preloaded - set(self._models)):
            failed = self._failed.get(name)
            if failed is None and not self._kept_loaded(name):
                continue  # its entry lets it idle out or be evicted: unloaded as asked
            why = self._failing.get(name) or (
                failed.message if failed else "its devices failed; it loads again"
            )
            found.append(f"{name}: preloaded, but not loaded ({why})")
        found.extend(report.quarantined(self._models.values()))
        return found


def _seen(task: asyncio.Task[Any]) -> None:
    """Mark a load no request awaited as looked at: its failure is logged where it happens."""
    if not task.cancelled():
        task.exception()
