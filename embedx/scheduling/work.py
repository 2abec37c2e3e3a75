"""The work records: a request (`Job`) and each of its texts (`Item`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NO_IDS = np.empty(0, dtype=np.int32)


class Job:
    """One caller's request: its reply future, its progress and its clocks.

    The queue owns `remaining` and `pending_tokens`; `out` is where its rows go (the
    engine's `RequestRows`), let go once the job is cancelled or failed.
    """

    __slots__ = (
        "cancelled",
        "error",
        "fed",
        "finished_at",
        "future",
        "out",
        "pending_items",
        "pending_tokens",
        "remaining",
        "size",
        "submitted_at",
        "tokens",
    )

    def __init__(self, size: int, *, future: asyncio.Future[None] | None = None) -> None:
        self.size = size
        self.remaining = size
        self.fed = 0  # texts queued so far: all of them once tokenization is done
        self.tokens = 0
        self.pending_items = 0
        self.pending_tokens = 0
        self.cancelled = False
        self.error: BaseException | None = None
        self.future = future
        self.out: Any = None  # the caller's rows, written by whoever runs the batches
        self.submitted_at = time.monotonic()
        self.finished_at: float | None = None

    def finish(self, now: float) -> None:
        self.finished_at = now
        if self.future is not None and not self.future.done():
            self.future.set_result(None)

    def fail(self, error: BaseException, now: float) -> None:
        self.cancelled = True
        self.out = None  # read by no one now: not kept while its queued items wait to be swept
        self.error = error
        self.finished_at = now
        if self.future is not None and not self.future.done():
            self.future.set_exception(error)


@dataclass(slots=True, eq=False)
class Item:
    """One text of a job: its place in the caller's list and its token ids."""

    job: Job
    index: int
    length: int
    ids: np.ndarray = field(default_factory=lambda: NO_IDS)  # (length,) int32: a chunk's view
    generation: int = 0
    enqueued_at: float = 0.0
    attempts: int = 0
