"""Admission: what a request costs, held until it is answered. Its body's bytes of
EMBEDX_MAX_BODY_BYTES_IN_FLIGHT before the body is read; then its inputs (texts, pairs) of
EMBEDX_MAX_INPUTS_IN_FLIGHT before they are queued, so that many small requests run together
where a few large ones fill the engine. Waiting ends at EMBEDX_REQUEST_QUEUE_TIMEOUT_S with
a 503."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from embedx.errors import QueueTimeout


class Admission:
    """The requests being embedded or scored, bounded by their inputs, not their number: 256
    one-text requests cost what one 256-text request does (a count of 32 kept the one-text
    ones queueing for a slot while the devices idled). Served strictly in arrival order, so a
    large request waiting is not passed forever by small ones."""

    def __init__(self, limit: int, timeout_s: float) -> None:
        self.inputs = Budget(
            limit, timeout_s, "inputs", "EMBEDX_MAX_INPUTS_IN_FLIGHT", in_order=True
        )
        self.running = 0
        self.waiting = 0

    @contextlib.asynccontextmanager
    async def slot(self, inputs: int) -> AsyncIterator[None]:
        """Hold `inputs` of the budget (all of it, for a request larger than it) while the
        request runs."""
        self.waiting += 1
        try:
            held = await self.inputs.reserve(max(1, inputs))
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self.inputs.release(held)

    def describe(self) -> dict[str, int | float]:
        return {
            "inputs_limit": self.inputs.limit,
            "inputs_held": self.inputs.held,
            "running": self.running,
            "waiting": self.waiting,
            "timeouts": self.inputs.timeouts,
            "queue_timeout_s": self.inputs.timeout_s,
        }


class Budget:
    """Units of one cost (a body's bytes, a request's inputs) held by the requests being
    served, so that many arriving together wait their turn instead of all being held at once.

    Waiting requests are served in arrival order. Unless `in_order`, each goes as soon as it
    fits: a large one waiting holds up no small one that fits beside the others (normal
    bodies go on being read while large ones queue). One larger than the whole budget takes
    all of it: it runs alone."""

    def __init__(
        self, limit: int, timeout_s: float, unit: str, setting: str, *, in_order: bool = False
    ) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self.unit = unit
        self.setting = setting
        self.in_order = in_order
        self.held = 0
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []
        self.timeouts = 0

    async def reserve(self, size: int) -> int:
        """Take `size` units (the whole budget at most) and return what was taken, for
        `release`; wait for them up to the queue timeout, then raise QueueTimeout."""
        size = min(size, self.limit)
        if self.held + size <= self.limit and not (self.in_order and self._queued()):
            self.held += size
            return size
        entry = (size, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            async with asyncio.timeout(self.timeout_s):
                await entry[1]
        except BaseException as exc:  # a timeout, or cancelled: the client left, a stop
            if entry[1].done() and not entry[1].cancelled():
                self.release(size)  # granted as it was given up
            else:
                entry[1].cancel()
                with contextlib.suppress(ValueError):  # `_grant` drops it if it got there first
                    self._waiting.remove(entry)
                self._grant()  # in order, those behind it may fit now
            if not isinstance(exc, TimeoutError):
                raise
            self.timeouts += 1
            raise QueueTimeout(
                f"the server is busy: requests holding {self.held} {self.unit} are being "
                f"served ({self.setting} is {self.limit}) and this one, of {size} "
                f"{self.unit}, waited {self.timeout_s:g} s"
            ) from None
        return size

    def _queued(self) -> bool:
        """Whether a request is waiting (not one given up, its owner not yet back)."""
        return any(not granted.done() for _, granted in self._waiting)

    def release(self, size: int) -> None:
        self.held -= size
        self._grant()

    def _grant(self) -> None:
        waiting: list[tuple[int, asyncio.Future[None]]] = []
        for size, granted in self._waiting:
            if granted.done():  # given up (cancelled), its owner not yet back to say so
                continue
            if self.held + size <= self.limit and not (self.in_order and waiting):
                self.held += size
                granted.set_result(None)
            else:
                waiting.append((size, granted))
        self._waiting = waiting
