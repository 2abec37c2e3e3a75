"""ModelRegistry: loads a model on first use (once, however many ask), keeps it while it is used,
and unloads it after its keep-alive or when the residency cap needs its room."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import hashlib
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from embedx import heap
from embedx.config import Settings
from embedx.engine import Engine, EngineOptions, EngineState, open_engine
from embedx.errors import (
    Bug,
    ConfigError,
    EmbedxError,
    InvalidOption,
    ModelNotFound,
    ModelsBusy,
    NoDeviceFits,
    PoolingConflict,
    PoolingRequired,
    ShuttingDown,
)
from embedx.models.catalog import ModelSpec, check_dtype
from embedx.models.loader import dtype_on, weight_bytes
from embedx.models.pooling import Pooling
from embedx.models.source import (
    HUB_PREFIX,
    PACKAGE_PREFIX,
    check_exists,
    is_repo_id,
    local_directory,
)
from embedx.telemetry import Histogram

if TYPE_CHECKING:
    from pathlib import Path

    from embedx.devices import Accelerator, DeviceInfo
    from embedx.models.source import ModelFiles

log = logging.getLogger("embedx.registry")
LOAD_BUCKETS_S = (0.5, 1, 2, 5, 10, 30, 60, 120, 300)
FOREVER = math.inf  # the keep-alive of a preloaded model: never idled out or evicted
# A load that failed (broken weights, no such model, a device that keeps failing) is
# answered from memory this long: each retry would read the files again, and evict a
# healthy idle model to make room for one that cannot load.
FAILED_LOAD_MEMORY_S = 30.0


@dataclass(frozen=True, slots=True)
class FailedLoad:
    """What a failed load told its requests: its error's kind and words, not the error
    itself, whose traceback holds every tensor the load had made."""

    at: float
    kind: type[EmbedxError]
    message: str
    param: str | None


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """What a request may say about a model's first load; ignored once it is resident,
    except a pooling that differs, which is a conflict."""

    pooling: str | None = None
    dtype: str | None = None
    max_seq_len: int | None = None
    keep_alive_s: float | None = None


class Resident:
    """A model in the registry: loading or loaded, with its users and idle timer."""

    __slots__ = (
        "engine",
        "keep_alive_s",
        "last_used",
        "spec",
        "task",
        "timer",
        "users",
    )

    def __init__(self, spec: ModelSpec, keep_alive_s: float) -> None:
        self.spec = spec
        self.keep_alive_s = keep_alive_s
        self.users = 0
        self.last_used = time.monotonic()
        self.engine: Engine | None = None
        self.task: asyncio.Task[Engine] | None = None
        self.timer: asyncio.TimerHandle | None = None


class ModelRegistry:
    def __init__(
        self,
        settings: Settings,
        catalog: dict[str, ModelSpec],
        devices: Sequence[DeviceInfo],
        open_accelerator: Callable[[DeviceInfo], Accelerator],
        *,
        local_paths: bool = True,
    ) -> None:
        self.settings = settings
        # Whether a name the catalog lacks may be a local directory: so for the library and
        # the CLI, whose caller is the operator; the server's requests only if its operator
        # says so (EMBEDX_ALLOW_LOCAL_PATHS).
        self.local_paths = local_paths
        self.catalog = catalog
        self.devices = list(devices)
        self._open_accelerator = open_accelerator
        self._models: dict[str, Resident] = {}
        self._load_slots = asyncio.Semaphore(settings.max_concurrent_loads)
        self._closing = False
        self._unloading: set[asyncio.Task[None]] = set()  # evicted engines still closing
        self._preloaded: set[str] = set()  # EMBEDX_PRELOAD's, kept loaded (FOREVER)
        self._failed: dict[str, FailedLoad] = {}
        # models kept for the server's life whose last load failed, with why
        self._failing: dict[str, str] = {}
        self.load_seconds = Histogram(LOAD_BUCKETS_S)
        self.loads = 0
        self.load_failures: Counter[str] = Counter()  # by the error's code
        self.evictions = 0

    # -- what a name means ---------------------------------------------------------------

    def spec_for(self, name: str, request: LoadRequest) -> ModelSpec:
        """The catalog's entry for `name`, or (unless catalog-only) a spec built from the
        request, with the request's load fields filling what the catalog leaves open. Without
        local paths, a name the catalog lacks is a Hugging Face repo id or nothing."""
        if request.dtype is not None:
            check_dtype(request.dtype)
        spec = self.catalog.get(name)
        if spec is None:
            if self.settings.catalog_only:
                raise ModelNotFound(
                    f"model {name!r} is not in this server's catalog (EMBEDX_CATALOG_ONLY is on)",
                    param="model",
                )
            if name.startswith(PACKAGE_PREFIX):  # it imports a module: the operator's to name
                raise ModelNotFound(
                    f"model {name!r} is not in this server's catalog: `package:` sources are "
                    "named in the models file, not by requests",
                    param="model",
                )
            source = name
            if not self.local_paths:
                # Decided from the name alone, never the disk: a path that exists and one that
                # does not get the same answer, so none can be probed.
                if not is_repo_id(name):
                    raise ModelNotFound(
                        f"model {name!r} is neither in this server's catalog nor a Hugging Face "
                        "repo id; requests may not name local directories here "
                        f"(EMBEDX_ALLOW_LOCAL_PATHS is off){self._did_you_mean(name)}",
                        param="model",
                    )
                source = HUB_PREFIX + name  # `org/model` is never a directory of the same name
            spec = ModelSpec(name=name, source=source, revision=self.settings.revision)
        pooling = _asked_pooling(name, spec.pooling, request.pooling)
        _asked_length(name, spec.max_seq_len, request.max_seq_len)
        return spec.with_overrides(
            pooling=spec.pooling or pooling,
            dtype=request.dtype if spec.dtype == "auto" else None,
            max_seq_len=spec.max_seq_len or request.max_seq_len,
            keep_alive_s=spec.keep_alive_s
            if spec.keep_alive_s is not None
            else request.keep_alive_s,
        )

    def look_up(self, name: str, spec: ModelSpec) -> bool:
        """Whether the model `spec` (for the name `name`) exists, False where the hub could
        not be asked (blocking: it may). One found nowhere is ModelNotFound, ending with the
        catalog name it may have meant."""
        try:
            return check_exists(spec.source, spec.revision)
        except ModelNotFound as exc:
            raise ModelNotFound(exc.message + self._did_you_mean(name), param=exc.param) from None

    def _did_you_mean(self, name: str) -> str:
        """A catalog name the request may have meant (the same model without its owner, or
        a near spelling), as the end of a message."""
        tail = name.rsplit("/", 1)[-1].lower()
        same = [known for known in self.catalog if known.rsplit("/", 1)[-1].lower() == tail]
        close = same or difflib.get_close_matches(name, list(self.catalog), n=1, cutoff=0.8)
        return f"; did you mean {close[0]!r}?" if close else ""

    def _served_as(self, name: str) -> tuple[str, Path | None]:
        """The name a request's model is served under, and the directory it names if it is a
        local one. That directory is one model however a request spells it (`/m`, `/m/`,
        `//./m`), not a copy of the weights per spelling, and its name says where it is to
        no client (see `local_name`)."""
        if name in self.catalog or self.settings.catalog_only or not self.local_paths:
            return name, None
        directory = local_directory(name)
        if directory is None:
            return name, None
        resolved = directory.resolve()
        return local_name(resolved), resolved

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
        name, directory = self._served_as(asked)
        if name not in self._models:
            self._check_failed(name)
            spec = self.spec_for(asked, request)
            if directory is not None:
                spec = spec.with_overrides(name=name, source=str(directory))
            if spec.pooling is None or len(self._models) >= self.settings.max_loaded_models:
                # A name that leads nowhere (a typo, an OpenAI model's) is a 404: not a request
                # to state how a model that does not exist pools, nor a reason to evict one
                # that does. (Below the cap nothing is evicted: its load finds out, and the
                # first requests are not held up by a lookup.)
                found = await asyncio.to_thread(self.look_up, asked, spec)
                if spec.pooling is None:
                    hint = self._did_you_mean(asked)
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
        _asked_pooling(name, resident.spec.pooling, request.pooling)
        if resident.engine is not None and not resident.engine.serving:
            # Every device of it failed. Its requests in flight fail anyway, and the fault
            # may have passed: it loads again, as it was (its pooling and length kept).
            self._evict(resident, "every device of it is quarantined")
            resident = self._reserve(resident.spec)
        resident.users += 1
        if resident.timer is not None:
            resident.timer.cancel()
            resident.timer = None
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
            _asked_length(name, resident.engine.tokenizer.max_seq_len, request.max_seq_len)
        except InvalidOption:
            self._release(resident)
            raise
        return resident

    def _reserve(self, spec: ModelSpec) -> Resident:
        """Take a residency slot (evicting the least recently used idle model if the cap is
        reached) and start loading once the engines closing have freed their memory.
        The slot is taken before any await, so concurrent cold loads never exceed the cap."""
        if len(self._models) >= self.settings.max_loaded_models:
            idle = [
                r
                for r in self._models.values()
                if r.users == 0 and r.engine is not None and r.keep_alive_s != FOREVER
            ]
            if not idle:
                if all(r.keep_alive_s == FOREVER for r in self._models.values()):
                    raise ModelsBusy(
                        f"{len(self._models)} models are resident (EMBEDX_MAX_LOADED_MODELS), "
                        "all preloaded (EMBEDX_PRELOAD), which stay: ask for one of them, or "
                        "the operator raises the cap",
                        retry=False,
                    )
                raise ModelsBusy(
                    f"{len(self._models)} models are resident (EMBEDX_MAX_LOADED_MODELS) and all "
                    "are in use, loading or preloaded; try again shortly"
                )
            victim = min(idle, key=lambda r: r.last_used)
            self._evict(victim, "to make room")
        keep_alive = spec.keep_alive_s
        if self._kept_loaded(spec.name):
            keep_alive = FOREVER  # whatever keep_alive the request that reloads it sends
        elif keep_alive is None:
            keep_alive = self.settings.default_keep_alive_s
        resident = Resident(spec, keep_alive)
        self._models[spec.name] = resident
        resident.task = asyncio.create_task(self._load(resident), name=f"load-{spec.name}")
        return resident

    async def _load(self, resident: Resident) -> Engine:
        spec = resident.spec
        files: ModelFiles | None = None
        try:
            # Their memory must be free before this model takes it: one evicted to make room,
            # or unloaded a moment ago (keep_alive 0, idle) and now asked for again.
            await asyncio.gather(*self._unloading, return_exceptions=True)
            async with self._load_slots:
                from embedx.models.source import resolve

                started = time.monotonic()
                files = await asyncio.to_thread(resolve, spec.source, spec.revision)
                while True:
                    try:
                        engine = await open_engine(
                            spec, files, self.devices, self.engine_options(), self._open_accelerator
                        )
                        break
                    except NoDeviceFits:
                        if not self._fits_alone(spec, files) or not await self._make_room(resident):
                            raise
                seconds = time.monotonic() - started
        except BaseException as exc:
            said = exc.message if isinstance(exc, EmbedxError) else ""
            if isinstance(exc, EmbedxError):  # the log may say where its files lie; no client
                _hide_directory(exc, spec, files)
            if self._models.get(spec.name) is resident:
                del self._models[spec.name]
            # a request's own options (a max_seq_len past the model's) are its client's error
            if isinstance(exc, EmbedxError) and not isinstance(exc, ShuttingDown | InvalidOption):
                self.load_failures[exc.code] += 1
                level = logging.ERROR if exc.status >= 500 else logging.WARNING  # files: 4xx
                log.log(level, "loading %s failed: %s", spec.name, said)
                if self._kept_loaded(spec.name) and not self._closing:
                    # the server was started to serve it: it tries again with no request
                    # waiting, and /health fails until it loads
                    self._failing[spec.name] = exc.message
                    self._load_again_later(spec.name)
            # Not remembered: a request's own options, memory that others' models held (freed
            # as they finish or idle out), and embedx's own bugs: none is the model's fault.
            remembered = not isinstance(exc, ShuttingDown | InvalidOption | NoDeviceFits | Bug)
            if isinstance(exc, EmbedxError) and remembered:
                now = time.monotonic()
                self._failed = {  # the expired go, so that many names keep no memory
                    name: failed
                    for name, failed in self._failed.items()
                    if now - failed.at < FAILED_LOAD_MEMORY_S
                }
                self._failed[spec.name] = FailedLoad(now, type(exc), exc.message, exc.param)
            raise
        self.load_seconds.observe(seconds)
        self.loads += 1
        self._failing.pop(spec.name, None)
        resident.engine = engine
        log.info("loaded %s in %.1f s", spec.name, seconds)
        self._settle_unused(resident)  # every request that waited for it may have left
        return engine

    def _fits_alone(self, spec: ModelSpec, files: ModelFiles) -> bool:
        """Whether the model's weights fit on some device that holds nothing else: if not,
        unloading other models cannot make room for it."""
        return any(
            weight_bytes(files, dtype_on(spec.dtype, d)) < d.total_memory for d in self.devices
        )

    async def _make_room(self, loading: Resident) -> bool:
        """Unload the least recently used idle model (not a preloaded one), for a model that
        fits on no device beside what is loaded; False if there is none."""
        idle = [
            r
            for r in self._models.values()
            if r is not loading and r.users == 0 and r.engine is not None
            and r.keep_alive_s != FOREVER
        ]  # fmt: skip
        if not idle:
            return False
        self._evict(min(idle, key=lambda r: r.last_used), f"to make room for {loading.spec.name}")
        await asyncio.gather(*self._unloading, return_exceptions=True)
        return True

    def _check_failed(self, name: str) -> None:
        """Raise again the error of this model's load if it failed lately."""
        failed = self._failed.get(name)
        if failed is None:
            return
        left = FAILED_LOAD_MEMORY_S - (time.monotonic() - failed.at)
        if left <= 0:
            del self._failed[name]
            return
        raise failed.kind(
            f"{failed.message} (its load failed {FAILED_LOAD_MEMORY_S - left:.0f} s ago; it is "
            f"tried again {left:.0f} s from now)",
            param=failed.param,
        )

    def engine_options(self) -> EngineOptions:
        return EngineOptions.from_settings(self.settings)

    def _release(self, resident: Resident) -> None:
        resident.users -= 1
        resident.last_used = time.monotonic()
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
            resident = self._reserve(self.spec_for(name, LoadRequest()))
        except EmbedxError as exc:  # every slot is held by a model in use: later, then
            log.warning("%s cannot load again now: %s", name, exc.message)
            self._load_again_later(name)
            return
        assert resident.task is not None
        resident.task.add_done_callback(_seen)  # a failure is logged and tried again

    def _load_again_later(self, name: str) -> None:
        asyncio.get_running_loop().call_later(FAILED_LOAD_MEMORY_S, self._load_again, name)

    def _expire(self, resident: Resident) -> None:
        resident.timer = None
        if resident.users == 0 and self._models.get(resident.spec.name) is resident:
            self._evict(resident, f"idle for {resident.keep_alive_s:.0f} s")

    def _evict(self, resident: Resident, why: str) -> None:
        """Forget the model now; its engine closes in the background (`_unloading`)."""
        del self._models[resident.spec.name]
        if resident.timer is not None:
            resident.timer.cancel()
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
            async with self.lease(name):
                pass

    # -- shutting down -------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> None:
        """Refuse new leases, let work in flight finish (bounded), unload everything."""
        self._closing = True
        residents = list(self._models.values())
        self._models.clear()
        for resident in residents:
            if resident.timer is not None:
                resident.timer.cancel()
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
        now = time.monotonic()
        described = []
        for resident in self._models.values():
            engine = resident.engine
            entry: dict[str, Any] = (
                engine.describe()
                if engine is not None
                else {"model": resident.spec.name, "state": EngineState.LOADING.value}
            )
            if engine is not None:
                entry.update(self._sources(engine.files))
            entry["users"] = resident.users
            keep_alive = resident.keep_alive_s  # None: preloaded, kept for good (JSON has no inf)
            entry["keep_alive_s"] = None if keep_alive == FOREVER else keep_alive
            entry["idle_s"] = 0.0 if resident.users else round(now - resident.last_used, 1)
            described.append(entry)
        return described

    def _sources(self, files: ModelFiles) -> dict[str, str]:
        """Where a model's files come from, as /info shows it: a local directory only as one,
        unless the operator asks to see where (EMBEDX_SHOW_MODEL_SOURCES)."""
        if self.settings.show_model_sources:
            return {"source": files.origin, "directory": str(files.directory)}
        if files.origin.startswith((HUB_PREFIX, PACKAGE_PREFIX)):
            return {"source": files.origin}
        return {"source": "local directory"}

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
        for resident in self._models.values():
            if resident.engine is None:
                continue
            for device in resident.engine.report().devices:
                if not device.up:
                    found.append(f"{resident.spec.name}: {device.device} ({device.reason})")
        return found


def local_name(directory: Path) -> str:
    """The name a local directory that a request named is served under: its own name and a
    digest of its path, one name per directory, that tells no client where it is."""
    digest = hashlib.sha256(str(directory).encode(errors="surrogateescape")).hexdigest()
    return f"local:{directory.name}@{digest[:12]}"


def _hide_directory(error: EmbedxError, spec: ModelSpec, files: ModelFiles | None) -> None:
    """Put the model's name where the error of its load says where its files lie (embedx's
    messages name files relative to the model's directory, but transformers' and others' name
    the directory): no client is told where a model's files are on the server's disk."""
    found = {str(files.directory)} if files is not None else set()
    if not spec.source.startswith((HUB_PREFIX, PACKAGE_PREFIX)):
        found.add(spec.source)
        directory = local_directory(spec.source)
        if directory is not None:
            found |= {str(directory), str(directory.resolve())}
    # a relative spelling says nothing of the disk (and `m` would match inside words)
    for spelling in sorted((f for f in found if f.startswith(("/", "~"))), key=len, reverse=True):
        error.message = error.message.replace(spelling, spec.name)
    error.args = (error.message,)


def check_preload(settings: Settings, catalog: Mapping[str, ModelSpec]) -> None:
    """EMBEDX_PRELOAD names catalog entries that state their pooling: no request comes with
    a preload to state it."""
    missing = [name for name in settings.preload if name not in catalog]
    if missing:
        raise ConfigError(f"EMBEDX_PRELOAD names models not in the catalog: {missing}")
    unpooled = [name for name in settings.preload if catalog[name].pooling is None]
    if unpooled:
        raise ConfigError(
            f"EMBEDX_PRELOAD names models without a pooling in the catalog: {unpooled}; "
            "add one to their entries in EMBEDX_MODELS_FILE"
        )


def check_default_model(settings: Settings, catalog: Mapping[str, ModelSpec]) -> None:
    """EMBEDX_DEFAULT_MODEL serves TEI's clients, which name no model and can state no
    pooling: it must be a catalog entry that states one."""
    name = settings.default_model
    if name is not None and (name not in catalog or catalog[name].pooling is None):
        raise ConfigError(
            f"EMBEDX_DEFAULT_MODEL {name!r} must be a catalog model with a pooling (in "
            "EMBEDX_MODELS_FILE): the requests it serves name no model and state no pooling"
        )


def _asked_length(name: str, reads: int | None, asked: int | None) -> None:
    """A request's max_seq_len, where its catalog entry or its load has fixed the model's,
    must be that one: silently reading another length would be wrong either way."""
    if asked is not None and reads is not None and asked != reads:
        raise InvalidOption(
            f"model {name!r} reads {reads} tokens a text (fixed by its catalog entry or its "
            f"first load); this request asks for max_seq_len {asked}: drop the field or use "
            "another name",
            param="max_seq_len",
        )


def _asked_pooling(name: str, stated: Pooling | None, asked: str | None) -> Pooling | None:
    """The pooling a request asks for, if any; a conflict if the model's is another one."""
    pooling = Pooling.parse(asked) if asked is not None else None
    if pooling is not None and stated is not None and pooling is not stated:
        raise PoolingConflict(
            f"model {name!r} uses {stated.value} pooling; this request asks for "
            f"{pooling.value}. Pooling is fixed per model: drop the field or use another name",
            param="pooling",
        )
    return pooling


def _seen(task: asyncio.Task[Any]) -> None:
    """Mark a load no request awaited as looked at: its failure is logged where it happens."""
    if not task.cancelled():
        task.exception()
