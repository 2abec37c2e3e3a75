"""ModelRegistry: loads a model on first use (once, however many ask), keeps it while it is used,
and unloads it after its keep-alive or when the residency cap needs its room."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from embedx import heap
from embedx.config import Settings
from embedx.engine import Engine
from embedx.errors import (
    EmbedxError,
    InvalidOption,
    ModelNotFound,
    PoolingRequired,
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
from embedx.registry.residency import FOREVER, Resident, least_recently_used, no_room

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
        self._models: dict[str, Resident] = {}
        self._closing = False
        self._unloading: set[asyncio.Task[None]] = set()  # evicted engines still closing
        self._preloaded: set[str] = set()  # EMBEDX_PRELOAD's, kept loaded (FOREVER)
        self._failed = FailedLoads(clock, FAILED_LOAD_MEMORY_S)
        # models kept for the server's life whose last load failed, with why
        self._failing: dict[str, str] = {}
        self.evictions = 0

    # -- leases --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lease(self, name: str, request: LoadRequest | None = None) -> AsyncIterator[Engine]:
        """The model's engine, loaded if need be, held (not evicted) until the block exits."""
        resident = await self._acquire(name, request or LoadRequest())
        try:
            assert resident.engine is not None
            yield resident.engine
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
            if unpooled or len(self._models) >= self.settings.max_loaded_models:
                # A name that leads nowhere (a typo, an OpenAI model's) is a 404: not a request
                # to state how a model that does not exist pools, nor a reason to evict one
                # that does. (Below the cap nothing is evicted: its load finds out, and the
                # first requests are not held up by a lookup.)
                found = await asyncio.to_thread(self.names.look_up, asked, spec)
                if unpooled:
                    hint = self.names.did_you_mean(asked)
                    unchecked = (
                        ""
                        if found
                        else " (the Hugging Face hub could not be reached to check that it "
                        "exists; with HF_HUB_OFFLINE=1 a name found nowhere is a 404)"
                    )
                    raise PoolingRequired(
                        f"model {asked!r} is not loaded and its pooling is unknown{unchecked}: "
                        "send pooling (cls, mean or last_token) with the first request, or add "
                        f"it to the catalog. embedx never guesses pooling{hint}",
                        param="pooling",
                    )
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
            self._evict(resident, "every device of it is quarantined")
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
        """Take a residency slot (evicting the least recently used idle model if the cap is
        reached) and start loading once the engines closing have freed their memory.
        The slot is taken before any await, so concurrent cold loads never exceed the cap."""
        if len(self._models) >= self.settings.max_loaded_models:
            victim = least_recently_used(self._models.values())
            if victim is None:
                raise no_room(list(self._models.values()))
            self._evict(victim, "to make room")
        keep_alive = spec.keep_alive_s
        if self._kept_loaded(spec.name):
            keep_alive = FOREVER  # whatever keep_alive the request that reloads it sends
        elif keep_alive is None:
            keep_alive = self.settings.default_keep_alive_s
        resident = Resident(spec, keep_alive, self.clock())
        self._models[spec.name] = resident
        resident.task = asyncio.create_task(self._load(resident), name=f"load-{spec.name}")
        return resident

    async def _load(self, resident: Resident) -> Engine:
        spec = resident.spec
        try:
            # Their memory must be free before this model takes it: one evicted to make room,
            # or unloaded a moment ago (keep_alive 0, idle) and now asked for again.
            await asyncio.gather(*self._unloading, return_exceptions=True)
            engine = await self.loads.open(spec, lambda: self._make_room(resident))
        except BaseException as exc:
            if self._models.get(spec.name) is resident:
                del self._models[spec.name]
            if isinstance(exc, EmbedxError):
                self._load_failed(spec.name, exc)
            raise
        self._failing.pop(spec.name, None)
        resident.engine = engine
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

    async def _make_room(self, loading: Resident) -> bool:
        """Unload the least recently used idle model (not a preloaded one), for a model that
        fits on no device beside what is loaded; False if there is none."""
        victim = least_recently_used(self._models.values(), sparing=loading)
        if victim is None:
            return False
        self._evict(victim, f"to make room for {loading.spec.name}")
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
            self._evict(resident, "every device of it is quarantined")
            self._load_again(resident.spec.name)  # now if the server keeps it, else when asked
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
        """Forget the model now; its engine closes in the background (`_unloading`)."""
        del self._models[resident.spec.name]
        resident.stop_timer()
        self.evictions += 1
        # a model that lost every device is an outage: seen at the warning level too
        level = logging.INFO if resident.engine and resident.engine.serving else logging.WARNING
        log.log(level, "unloading %s (%s)", resident.spec.name, why)
        engine = resident.engine
        resident.engine = None
        assert engine is not None
        task = asyncio.create_task(engine.close(), name=f"unload-{resident.spec.name}")
        self._unloading.add(task)
        task.add_done_callback(self._unloaded)

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
        residents = list(self._models.values())
        self._models.clear()
        for resident in residents:
            resident.stop_timer()
            if resident.task is not None and not resident.task.done():
                resident.task.cancel()
        await asyncio.gather(
            *(r.task for r in residents if r.task is not None), return_exceptions=True
        )
        engines = [r.engine for r in residents if r.engine is not None]
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
        models = self._models.values()
        return report.registry_report(models, self.loads, self.evictions, len(self._failing))

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
