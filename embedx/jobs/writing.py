"""A corpus job's finished chunks written in order, each to its part and (a Parquet OUTPUT)
to the output, on two threads of their own."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from embedx import os_threads
from embedx.jobs.parts import Chunk, WorkFolder, part_table
from embedx.jobs.results import StreamedParquet
from embedx.library import waited

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")


class Writes:
    """The writes of the chunks that come back from the engine. The part and the output are
    written on threads of their own, so that neither waits for the other, nor the engine for
    either. A chunk's writes queue behind the chunk before it, and the caller goes on once
    that one is written: at most two chunks are held here. `part_s` and `output_s`: the
    seconds each thread spent writing.

    Leaving waits for the writes under way: a part appears whole or not at all."""

    def __init__(self, work: WorkFolder, streamed: StreamedParquet | None) -> None:
        self.part_s = 0.0
        self.output_s = 0.0
        self._work = work
        self._streamed = streamed
        self._parts = os_threads.executor(1, "embedx-parts")
        self._output = os_threads.executor(1, "embedx-output")
        self._last: list[Future[None]] = []  # the writes of the chunk before

    def __enter__(self) -> Writes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._parts.shutdown()
        self._output.shutdown()

    def chunk(self, chunk: Chunk) -> None:
        """A chunk the engine gave back."""
        table = part_table(chunk)
        writes = [self._parts.submit(self._part, chunk.index, table)]
        if self._streamed is not None:
            writes.append(self._output.submit(self._add, self._streamed.add, table))
        self._next(writes)

    def resumed(self, part: Path) -> None:
        """A chunk an earlier run finished: its rows in their place in the output."""
        if self._streamed is not None:
            self._next([self._output.submit(self._add, self._streamed.add_part, part)])

    def finish(self) -> None:
        """Wait for every write."""
        self._next([])

    def _next(self, writes: list[Future[None]]) -> None:
        for write in self._last:
            waited(write)
        self._last = writes

    def _part(self, index: int, table: pa.Table) -> None:
        started = time.perf_counter()
        self._work.write(index, table)
        self.part_s += time.perf_counter() - started

    def _add(self, add: Callable[[T], None], rows: T) -> None:
        started = time.perf_counter()
        add(rows)
        self.output_s += time.perf_counter() - started
