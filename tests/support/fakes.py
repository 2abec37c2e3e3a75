"""Fakes of what tests cannot set: CPU devices under any name and speed score, a forward that
runs as slow as the test sets, fails or hangs on the batches it picks, waits at a gate the
test opens, and counts what it ran; and a clock the test moves."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests.support.waiting import PATIENCE_S

if TYPE_CHECKING:
    import torch

    from embedx.devices import DeviceInfo
    from embedx.engine import Engine


def cpu_info(key: str = "cpu", score: float = 1.0) -> DeviceInfo:
    """A device the engine serves on a CPU thread of its own, named `key`: several of them make
    a host of many devices (what they compute is the CPU's, bit for bit)."""
    from embedx.devices import DeviceInfo

    return DeviceInfo(key, "cpu", f"fake {key}", 1 << 34, 1 << 34, 2, None, score)


class TickingClock:
    """A monotonic clock that moves when the test `advance`s it, and a tick at each reading,
    so that a span the code measures between two readings is never zero. Thread-safe."""

    def __init__(self, tick: float = 1e-6) -> None:
        self.tick = tick
        self._now = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self._now += self.tick
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class Gate:
    """Holds a fake device's batches until the test lets them run: one at a time (`step`), or
    every one from now on (`open`). A device busy exactly as long as the test needs, where a
    set speed would leave it to how busy the machine is."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._permits = 0
        self._open = False

    def step(self) -> None:
        with self._changed:
            self._permits += 1
            self._changed.notify_all()

    def open(self) -> None:
        with self._changed:
            self._open = True
            self._changed.notify_all()

    def wait(self) -> None:
        """In the device's thread: until the test lets this batch run."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._open or self._permits, PATIENCE_S):
                raise AssertionError("a batch was held at its gate past the test's patience")
            if not self._open:
                self._permits -= 1


class SlowForward:
    """Wraps a replica's forward: waits at `gate` if given, fails the batches `fail` picks,
    and takes `tokens / rate` seconds if a rate is given (in the device's thread: the fake
    device's speed, the compute time it simulates, not a wait for anything). Counts what it
    ran."""

    def __init__(
        self,
        forward: Callable[[Any], Any],
        *,
        rate: float | None = None,
        fail: Callable[[Any, int], BaseException | None] | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.forward = forward
        self.gate = gate
        self.rate = rate
        self.fail = fail
        self.calls = 0
        self.tokens = 0
        self._lock = threading.Lock()

    def __call__(self, batch: Any) -> Any:
        with self._lock:
            self.calls += 1
            call = self.calls
        if self.gate is not None:
            self.gate.wait()
        tokens = int(batch.input_ids.shape[0])
        error = self.fail(batch, call) if self.fail else None
        if error is not None:
            raise error
        if self.rate:
            time.sleep(tokens / self.rate)
        out = self.forward(batch)
        with self._lock:
            self.tokens += tokens
        return out


def wrap(engine: Engine, device: str, **behaviour: Any) -> SlowForward:
    """Replace one device's forward with a slowed or faulty one; returns the wrapper. Its
    CUDA graphs go: a replayed batch never calls the forward, so would not see the fault."""
    for replica in engine.replicas:
        if replica.accelerator.info.label == device:
            wrapper = SlowForward(replica.model.forward, **behaviour)
            replica.model.forward = wrapper  # type: ignore[method-assign]
            replica.graphs = None
            return wrapper
    raise AssertionError(f"no device {device}")


def oom(message: str = "CUDA out of memory (injected)") -> torch.OutOfMemoryError:
    import torch

    return torch.OutOfMemoryError(message)


def spin_gpu(cycles: int) -> None:
    """Keep the current CUDA device busy for `cycles` of its clock (torch's private test
    kernel): a device that hangs, the behaviour a test is about, not a wait."""
    import torch

    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
