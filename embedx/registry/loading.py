"""Opening a model for the registry: a few loads at a time, its files resolved, room made by
unloading idle models where it fits on a device alone, and its time and failures counted."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from embedx.config import Settings
from embedx.engine import Engine, EngineOptions, open_engine
from embedx.errors import EmbedxError, InvalidOption, NoDeviceFits, ShuttingDown
from embedx.models.catalog import ModelSpec
from embedx.models.loader import dtype_on, weight_bytes
from embedx.registry.failures import hide_directory
from embedx.telemetry import Histogram

if TYPE_CHECKING:
    from embedx.devices import Accelerator, DeviceInfo
    from embedx.models.source import ModelFiles

log = logging.getLogger("embedx.registry")
LOAD_BUCKETS_S = (0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class Loads:
    """Loads models onto the host's devices, at most EMBEDX_MAX_CONCURRENT_LOADS at once."""

    def __init__(
        self,
        settings: Settings,
        devices: Sequence[DeviceInfo],
        open_accelerator: Callable[[DeviceInfo], Accelerator],
        clock: Callable[[], float],
    ) -> None:
        self.options = EngineOptions.from_settings(settings)
        self.devices = list(devices)
        self._open_accelerator = open_accelerator
        self._slots = asyncio.Semaphore(settings.max_concurrent_loads)
        self.clock = clock
        self.seconds = Histogram(LOAD_BUCKETS_S)
        self.done = 0
        self.failures: Counter[str] = Counter()  # by the error's code

    async def open(self, spec: ModelSpec, make_room: Callable[[], Awaitable[bool]]) -> Engine:
        """The model loaded; where it fits on no device beside the models loaded, but would
        alone, `make_room` unloads one (False: none can go) and the load tries again. Its
        error names no directory of the server's (`hide_directory`)."""
        files: ModelFiles | None = None
        try:
            async with self._slots:
                from embedx.models.source import resolve

                started = self.clock()
                files = await asyncio.to_thread(resolve, spec.source, spec.revision)
                while True:
                    try:
                        engine = await open_engine(
                            spec, files, self.devices, self.options, self._open_accelerator
                        )
                        break
                    except NoDeviceFits:
                        if not self._fits_alone(spec, files) or not await make_room():
                            raise
        except EmbedxError as exc:
            said = exc.message  # the log may say where its files lie; no client
            hide_directory(exc, spec, files)
            # a request's own options (a max_seq_len past the model's) are its client's error
            if not isinstance(exc, ShuttingDown | InvalidOption):
                self.failures[exc.code] += 1
                level = logging.ERROR if exc.status >= 500 else logging.WARNING  # files: 4xx
                log.log(level, "loading %s failed: %s", spec.name, said)
            raise
        seconds = self.clock() - started
        self.seconds.observe(seconds)
        self.done += 1
        log.info("loaded %s in %.1f s", spec.name, seconds)
        return engine

    def _fits_alone(self, spec: ModelSpec, files: ModelFiles) -> bool:
        """Whether the model's weights fit on some device that holds nothing else: if not,
        unloading other models cannot make room for it."""
        return any(
            weight_bytes(files, dtype_on(spec.dtype, d)) < d.total_memory for d in self.devices
        )
