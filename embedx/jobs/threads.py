"""The reading thread of a corpus job, as its main thread sees it: an iterator made ahead on a
thread of its own, whose waits a signal ends."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from embedx import os_threads
from embedx.library import SIGNAL_CHECK_S as WAKE_S  # how often a wait looks up for a signal

T = TypeVar("T")
_END = object()


class Prefetch(Generic[T]):
    """An iterator's items made on a thread of their own, one ahead of the caller.
    `busy_s`: the seconds that thread spent making them."""

    def __init__(self, items: Iterator[T], name: str) -> None:
        self.busy_s = 0.0
        self._items = items
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = os_threads.thread(self._run, name)

    def __enter__(self) -> Prefetch[T]:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()  # a read in progress ends at its next item; the thread is a daemon

    def _run(self) -> None:
        try:
            while True:
                started = time.perf_counter()
                item = next(self._items, _END)
                self.busy_s += time.perf_counter() - started
                if item is _END:
                    break
                if not self._put(("item", item)):
                    return
            self._put(("end", None))
        except BaseException as exc:  # the caller raises it, in its own thread
            self._put(("error", exc))

    def _put(self, entry: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(entry, timeout=WAKE_S)
                return True
        return False

    def __iter__(self) -> Iterator[T]:
        while True:
            try:
                kind, value = self._queue.get(timeout=WAKE_S)  # a signal is raised between
            except queue.Empty:
                continue
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
