"""Admission: at most EMBEDX_MAX_CONCURRENT_REQUESTS embedding requests run; the rest wait in
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
