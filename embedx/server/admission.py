"""Admission: requests reserve their body's bytes of EMBEDX_MAX_BODY_BYTES_IN_FLIGHT before it
is read, and at most EMBEDX_MAX_CONCURRENT_REQUESTS embedding requests run; the rest wait in
arrival order up to EMBEDX_REQUEST_QUEUE_TIMEOUT_S, then get a 503."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from embedx.errors import QueueTimeout


class Admission:
    def __init__(self, limit: int, timeout_s: float) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(limit)
        self.running = 0
        self.waiting = 0
        self.timeouts = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        self.waiting += 1
        try:
            # not wait_for: on 3.11 it can return the slot to a request cancelled meanwhile
            # (its client gone), which then runs anyway
            async with asyncio.timeout(self.timeout_s):
                await self._slots.acquire()  # a free slot is taken at once, even at timeout 0
        except TimeoutError:
            self.timeouts += 1
            raise QueueTimeout(
                f"the server is busy: {self.limit} requests are running "
                f"(EMBEDX_MAX_CONCURRENT_REQUESTS) and this one waited {self.timeout_s:g} s"
            ) from None
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()

    def describe(self) -> dict[str, int | float]:
        return {
            "limit": self.limit,
            "running": self.running,
            "waiting": self.waiting,
            "timeouts": self.timeouts,
            "queue_timeout_s": self.timeout_s,
        }


class ByteBudget:
    """The bytes of request bodies being read, parsed and embedded at once. A request reserves
    its body's length before the body is read and holds it until it is answered, so that many
    large bodies arriving together wait their turn instead of all being held in memory.

    Waiting requests are served in arrival order, each as soon as its body fits: a large body
    waiting holds up no small one that fits beside the others (normal requests go on being
    served while large ones queue). One larger than the whole budget takes all of it: it runs
    alone."""

    def __init__(self, limit: int, timeout_s: float) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self.held = 0
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []
        self.timeouts = 0

    async def reserve(self, size: int) -> int:
        """Take `size` bytes (the whole budget at most) and return what was taken, for
        `release`; wait for them up to the queue timeout, then raise QueueTimeout."""
        size = min(size, self.limit)
        if self.held + size <= self.limit:
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
            if not isinstance(exc, TimeoutError):
                raise
            self.timeouts += 1
            raise QueueTimeout(
                f"the server is busy: {self.held} bytes of request bodies are being read or "
                f"embedded (EMBEDX_MAX_BODY_BYTES_IN_FLIGHT is {self.limit}) and this one, "
                f"of {size} bytes, waited {self.timeout_s:g} s"
            ) from None
        return size

    def release(self, size: int) -> None:
        self.held -= size
        self._grant()

    def _grant(self) -> None:
        waiting = []
        for size, granted in self._waiting:
            if granted.done():  # given up (cancelled), its owner not yet back to say so
                continue
            if self.held + size <= self.limit:
                self.held += size
                granted.set_result(None)
            else:
                waiting.append((size, granted))
        self._waiting = waiting
