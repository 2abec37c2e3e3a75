"""Devices: discovery (torch + NVML), ranking, memory-derived token budgets, and the CUDA and CPU
accelerators that run a batch and let the event loop await it. The only module that names CUDA."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from embedx import os_threads
from embedx.config import Settings
from embedx.errors import ConfigError, DeviceHung

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

# Activation memory is measured on a probe batch; this much of the free memory is left
# unused for the allocator's fragmentation and other tenants' growth.
MEMORY_HEADROOM = 0.15
MIN_BATCH_TOKENS = 256
# On the CPU larger batches only fall out of the caches: 512 to 4096 tokens ran fastest
# (all-MiniLM-L6-v2, 2 cores), 16384 a quarter slower.
CPU_BATCH_TOKENS = 4096
# CUDA event polling step. uvloop counts timers in whole milliseconds and rounds: a 0.5 ms
# sleep there returned at once, so a loop awaiting a batch spun, taking a core and the
# interpreter lock from the tokenizer's and the HTTP server's threads.
POLL_S = 0.001


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What discovery found out about one device, before any model is loaded."""

    key: str  # as EMBEDX_DEVICES names it: "0", "1", ... or "cpu"
    kind: str  # "cuda" or "cpu"
    name: str
    total_memory: int
    free_memory: int
    multiprocessors: int  # CUDA SMs, or CPU cores
    compute_capability: tuple[int, int] | None
    score: float  # static speed score: orders devices before a model's load measures them

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def label(self) -> str:
        return f"cuda:{self.key}" if self.is_cuda else self.key

    @property
    def supports_bf16(self) -> bool:
        return self.compute_capability is not None and self.compute_capability >= (8, 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.label,
            "name": self.name,
            "total_memory_bytes": self.total_memory,
            "free_memory_bytes": self.free_memory,
            "multiprocessors": self.multiprocessors,
            "compute_capability": (
                ".".join(map(str, self.compute_capability)) if self.compute_capability else None
            ),
            "score": round(self.score, 3),
        }


def _cuda_score(multiprocessors: int, capability: tuple[int, int]) -> float:
    """Dense matrix throughput per SM roughly doubles with each tensor-core generation."""
    per_sm = {7: 1.0, 8: 2.0, 9: 4.0, 10: 8.0}.get(capability[0], 0.5)
    return multiprocessors * per_sm


def _nvml_free_memory() -> dict[str, tuple[int, int]]:
    """Free and total memory by GPU UUID, from NVML (which sees other processes' use)."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    found: dict[str, tuple[int, int]] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found[uuid.removeprefix("GPU-")] = (int(memory.free), int(memory.total))
    finally:
        pynvml.nvmlShutdown()
    return found


def _cpu_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                key, _, rest = line.partition(":")
                fields[key] = int(rest.split()[0]) * 1024
    except OSError:
        return 0, 0
    return fields.get("MemAvailable", 0), fields.get("MemTotal", 0)


def discover(settings: Settings) -> list[DeviceInfo]:
    """The devices to serve on, fastest (by static score) first.

    `EMBEDX_DEVICES` picks GPU indices (as torch numbers them, after CUDA_VISIBLE_DEVICES)
    and `cpu`; `auto` means every GPU, or the CPU when there is none.
    """
    import torch

    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    wanted = settings.devices
    if wanted is None:
        wanted = tuple(str(i) for i in range(cuda_count)) or ("cpu",)
    nvml = _nvml_free_memory() if cuda_count else {}
    found: list[DeviceInfo] = []
    for key in wanted:
        if key == "cpu":
            available, total = _cpu_memory()
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
            found.append(
                DeviceInfo("cpu", "cpu", "cpu", total, available, cores, None, cores * 0.02)
            )
            continue
        index = int(key)
        if index >= cuda_count:
            raise ConfigError(
                f"EMBEDX_DEVICES names GPU {index}, but torch sees {cuda_count} GPU(s)"
                + (
                    " (CUDA_VISIBLE_DEVICES is set)"
                    if os.environ.get("CUDA_VISIBLE_DEVICES")
                    else ""
                )
            )
        props = torch.cuda.get_device_properties(index)
        capability = (props.major, props.minor)
        uuid = str(getattr(props, "uuid", ""))
        free, total = nvml.get(uuid, (0, 0))
        if not total:  # NVML unavailable: ask the CUDA runtime (this creates a context)
            free, total = torch.cuda.mem_get_info(index)
        found.append(
            DeviceInfo(
                key,
                "cuda",
                props.name,
                int(total),
                int(free),
                props.multi_processor_count,
                capability,
                _cuda_score(props.multi_processor_count, capability),
            )
        )
    weights = settings.device_weights
    served = {d.key for d in found}
    for variable, named in (
        ("EMBEDX_DEVICE_WEIGHTS", weights),
        ("EMBEDX_DEVICE_BATCH_TOKENS", settings.device_batch_tokens),
    ):
        if unknown := set(named) - served:  # a typo would otherwise do nothing, silently
            raise ConfigError(
                f"{variable} names devices not served: {sorted(unknown)} "
                f"(served: {sorted(served)}; EMBEDX_DEVICES chooses them)"
            )
    found = [dataclasses.replace(d, score=weights.get(d.key, d.score)) for d in found]
    return sorted(found, key=lambda d: -d.score)


def token_budget(
    free_memory: int,
    bytes_per_token: float,
    inflight: int,
    *,
    cap: int,
    override: int | None = None,
) -> int:
    """Padded tokens per batch a device can hold `inflight` of, within `cap`; an operator's
    per-device `override` wins."""
    if override is not None:
        return override
    if bytes_per_token <= 0:  # the CPU: memory is not what limits it
        return min(cap, CPU_BATCH_TOKENS)
    usable = free_memory * (1 - MEMORY_HEADROOM)
    fits = int(usable / (bytes_per_token * inflight))
    return max(MIN_BATCH_TOKENS, min(cap, fits))


class Launch(Generic[T]):
    """A batch handed to a device, to be awaited with `Accelerator.result`."""

    __slots__ = ()


class Accelerator(Protocol):
    """Runs batches on one device and lets the event loop await them without blocking."""

    info: DeviceInfo
    device: torch.device
    max_inflight: int

    def launch(self, work: Callable[[], T]) -> Launch[T]: ...

    async def result(
        self, launch: Launch[T], deadline_s: float, expected_s: float = 0.0
    ) -> tuple[T, float]:
        """The work's output and the device seconds it took; DeviceHung past the deadline.
        `expected_s`: what the batch should take, where known."""
        ...

    def free_memory(self) -> int: ...

    def peak_memory(self, reset: bool = False) -> int: ...

    def release_cached_memory(self) -> None: ...

    def synchronize(self) -> None:
        """Wait until every batch launched on this device has finished."""
        ...

    def is_out_of_memory(self, error: BaseException) -> bool: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class CudaLaunch(Launch[T]):
    output: T
    started: Any  # torch.cuda.Event
    finished: Any  # torch.cuda.Event
    launched_at: float


class CudaAccelerator:
    """One GPU: batches run on a dedicated stream; completion is seen by polling a CUDA event.

    `launch` only enqueues work, so two batches can be in flight: the next one is built and
    launched while the GPU runs the current one.
    """

    max_inflight = 2

    def __init__(self, info: DeviceInfo) -> None:
        import torch

        self.info = info
        self.device = torch.device("cuda", int(info.key))
        self._torch = torch
        self.stream = _device_stream(self.device)
        self.hung = False  # a batch ran past its deadline: waiting for the GPU may never end

    def launch(self, work: Callable[[], T]) -> CudaLaunch[T]:
        cuda = self._torch.cuda
        with cuda.device(self.device), cuda.stream(self.stream):
            started = cuda.Event(enable_timing=True)
            finished = cuda.Event(enable_timing=True)
            started.record(self.stream)
            output = work()
            finished.record(self.stream)
        return CudaLaunch(output, started, finished, time.monotonic())

    async def result(
        self, launch: Launch[T], deadline_s: float, expected_s: float = 0.0
    ) -> tuple[T, float]:
        assert isinstance(launch, CudaLaunch)
        finished = launch.finished
        give_up = launch.launched_at + deadline_s
        # A batch due within one polling step (a few short texts) is looked at on every turn
        # of the loop until then: a whole step's sleep would take longer than the batch.
        watch_until = launch.launched_at + POLL_S if expected_s < POLL_S else 0.0
        while not finished.query():
            now = time.monotonic()
            if now > give_up:
                self.hung = True
                raise DeviceHung(f"{self.info.label}: a batch ran past {deadline_s:.1f} s")
            await asyncio.sleep(0 if now < watch_until else POLL_S)
        return launch.output, launch.started.elapsed_time(finished) / 1000.0

    def free_memory(self) -> int:
        free, _ = self._torch.cuda.mem_get_info(self.device)
        return int(free)

    def peak_memory(self, reset: bool = False) -> int:
        cuda = self._torch.cuda
        if reset:
            cuda.synchronize(self.device)
            cuda.reset_peak_memory_stats(self.device)
        return int(cuda.max_memory_allocated(self.device))

    def release_cached_memory(self) -> None:
        with self._torch.cuda.device(self.device):
            self._torch.cuda.synchronize()
            self._torch.cuda.empty_cache()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def is_out_of_memory(self, error: BaseException) -> bool:
        return isinstance(error, self._torch.OutOfMemoryError)

    def close(self) -> None:
        # Emptying the cache synchronizes the device: behind a hung kernel that waits for
        # ever, and with it the model's unload and the reload waiting for that
        if not self.hung:
            self.release_cached_memory()


_STREAMS: dict[int, torch.cuda.Stream] = {}


def _device_stream(device: torch.device) -> torch.cuda.Stream:
    """The process's one side stream on a GPU, shared by every model loaded there: PyTorch
    keeps a cuBLAS workspace (32 MiB on Hopper) per stream until the process exits, so a
    fresh stream for each load would leave one behind per evicted model."""
    import torch

    index = device.index or 0
    if index not in _STREAMS:
        with torch.cuda.device(device):
            _STREAMS[index] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    return _STREAMS[index]


@dataclass(slots=True)
class ThreadLaunch(Launch[T]):
    future: concurrent.futures.Future[tuple[T, float]]
    launched_at: float


# oneDNN, which runs torch's matrix products on the CPU, caches a primitive for each input
# shape it meets (1,024 by default), and batches of texts come in every shape: a CPU
# process grew from 481 to 2,060 MB over 240 requests; with no cache, 445 to 534 MB, no
# slower (MiniLM, 100 texts a request). Read when torch first runs one; a value already set wins.
ONEDNN_CACHE = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")


class CpuAccelerator:
    """The host CPU: torch blocks its caller here, so batches run on one worker thread. Opening
    it turns oneDNN's primitive cache off (ONEDNN_CACHE), unless the environment sets it."""

    max_inflight = 1

    def __init__(self, info: DeviceInfo) -> None:
        os.environ.setdefault(*ONEDNN_CACHE)  # before the first batch, which reads it
        import torch

        self.info = info
        self.device = torch.device("cpu")
        self._executor = os_threads.executor(1, "embedx-cpu")

    def launch(self, work: Callable[[], T]) -> ThreadLaunch[T]:
        def timed() -> tuple[T, float]:
            started = time.perf_counter()
            output = work()
            return output, time.perf_counter() - started

        return ThreadLaunch(self._executor.submit(timed), time.monotonic())

    async def result(
        self, launch: Launch[T], deadline_s: float, expected_s: float = 0.0
    ) -> tuple[T, float]:
        assert isinstance(launch, ThreadLaunch)
        remaining = launch.launched_at + deadline_s - time.monotonic()
        try:
            # not wait_for: on 3.11 it drops a cancellation that arrives as the batch finishes,
            # and the worker that closing cancelled would live on
            async with asyncio.timeout(max(0.0, remaining)):
                return await asyncio.wrap_future(launch.future)
        except TimeoutError:
            raise DeviceHung(f"{self.info.label}: a batch ran past {deadline_s:.1f} s") from None

    def free_memory(self) -> int:
        available, total = _cpu_memory()
        return available if total else sys.maxsize  # no /proc/meminfo: nothing to go by

    def peak_memory(self, reset: bool = False) -> int:
        return 0

    def release_cached_memory(self) -> None:
        return None

    def synchronize(self) -> None:
        return None  # the worker thread runs one batch at a time, synchronously

    def is_out_of_memory(self, error: BaseException) -> bool:
        import torch

        return isinstance(error, torch.OutOfMemoryError) or (
            isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
        )

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def open_accelerator(info: DeviceInfo) -> Accelerator:
    return CudaAccelerator(info) if info.is_cuda else CpuAccelerator(info)
