"""The corpus job, `embedx embed MODEL INPUT... -o OUTPUT`: chunks of texts read on one thread,
embedded on every device through the library, written on another (a Parquet OUTPUT as they
finish; .npy and safetensors joined from the chunks once all are done)."""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Generic, TextIO, TypeVar

import numpy as np

from embedx.config import Settings
from embedx.embedder import Embedder
from embedx.engine import EmbedOptions
from embedx.errors import EmbedxError, InvalidInput, PoolingRequired
from embedx.jobs.inputs import Bad, Fields, Reader, Record, Shard, shards
from embedx.jobs.parts import Chunk, WorkFolder
from embedx.jobs.progress import Progress
from embedx.jobs.results import StreamedParquet, join, output_format, write_bad

T = TypeVar("T")
CHUNK_TEXTS = 50_000  # a chunk: large enough that a device's tail per chunk is a small share
WAKE_S = 0.1  # how often a wait looks up for a signal


@dataclass(frozen=True, slots=True)
class CorpusJob:
    model: str
    inputs: Sequence[str]
    output: Path
    pooling: str | None = None
    fields: Fields = field(default_factory=Fields)
    input_type: str | None = None
    dimensions: int | None = None
    skip_bad: bool = False
    chunk_texts: int = CHUNK_TEXTS

    @property
    def bad_file(self) -> Path:
        return self.output.with_name(self.output.name + ".bad.jsonl")

    def manifest(self, files: Sequence[Shard]) -> dict[str, Any]:
        """What a work folder's parts were made of: the inputs as they were, and the settings
        that change a row. (Not --skip-bad: a run stopped by a bad line resumes with it.)"""
        settings = dataclasses.asdict(self)
        for name in ("inputs", "output", "skip_bad"):
            del settings[name]
        return {"job": "embedx corpus", "inputs": [f.identity() for f in files], **settings}


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def command(job: CorpusJob, settings: Settings, stream: TextIO = sys.stderr) -> int:
    """Run `job` for the command line: its summary or its one error line, and an exit code."""
    work = WorkFolder(job.output, {}).path
    try:
        print(run(job, settings, stream), file=stream)
        return 0
    except PoolingRequired:
        print(f"embedx: the catalog does not say how {job.model!r} pools: add "
              "--pooling cls|mean|last_token", file=stream)  # fmt: skip
        return 1
    except EmbedxError as exc:
        print(f"embedx: {exc.message}", file=stream)
        return 1
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        kept = f": the finished chunks are in {work}; the same command resumes"
        kept = kept if work.exists() else ""
        print(f"embedx: stopped by {signal.Signals(signum).name}{kept}", file=stream)
        return 128 + signum


def run(
    job: CorpusJob,
    settings: Settings,
    stream: TextIO = sys.stderr,
    embedder: ChunkEmbedder | None = None,
) -> str:
    """Embed every text of the job's inputs into its output; returns the summary line. With
    `embedder` (a model already loaded), the job's model and pooling are its, and it is left
    open."""
    files = shards(job.inputs)
    reader = Reader(files, job.fields)
    work = WorkFolder(job.output, job.manifest(files))
    finished = work.open()
    streamed: StreamedParquet | None = None
    progress = Progress(reader.total_bytes, stream)
    model: contextlib.AbstractContextManager[ChunkEmbedder] = (
        contextlib.nullcontext(embedder)
        if embedder is not None
        else ChunkEmbedder(job.model, pooling=job.pooling, settings=settings)
    )
    try:
        with (
            _sigterm_raises(),
            model as embedder,
            Prefetch(chunks(reader, job.chunk_texts)) as incoming,
            ThreadPoolExecutor(1, "embedx-writer") as writer,  # its exit waits for the write
        ):
            width = job.dimensions or embedder.dimensions
            if output_format(job.output) == "parquet":
                streamed = StreamedParquet(work.path / ".output.tmp", width)
            progress.start()  # the model is loaded: the clock is the embedding's
            written: Future[None] | None = None
            for index, records, bad, position in incoming:
                if index in finished:
                    progress.skipped(position)
                    if streamed is not None:  # in its place in the output, from its part
                        if written is not None:
                            written.result()
                        written = writer.submit(streamed.add_part, finished[index])
                    continue
                if bad and not job.skip_bad:
                    raise InvalidInput(
                        f"{bad[0].message()} (--skip-bad embeds the rest and lists such "
                        f"lines in {job.bad_file})"
                    )
                chunk = embedder.chunk(index, records, bad, job)
                if written is not None:
                    written.result()
                written = writer.submit(_write, work, chunk, streamed)
                progress.advance(position, len(records), int(chunk.tokens.sum()))
            if written is not None:
                written.result()
    finally:
        progress.close()
        if streamed is not None:
            streamed.close()  # stopped: what it wrote goes with the next run's open()
    parts = list(work.parts().values())
    if streamed is None or not streamed.finish(job.output):
        join(parts, job.output, width, work.path / ".output.tmp")
    bad_lines = write_bad(parts, job.bad_file)
    work.remove()
    return progress.summary(str(job.output), bad_lines, str(job.bad_file))


def _write(work: WorkFolder, chunk: Chunk, streamed: StreamedParquet | None) -> None:
    """A finished chunk to its part, and to the output streamed beside it."""
    table = work.write(chunk)
    if streamed is not None:
        streamed.add(table)


def chunks(reader: Reader, size: int) -> Iterator[tuple[int, list[Record], list[Bad], int]]:
    """(index, records, bad lines, bytes read) of every `size` lines, in order."""
    records: list[Record] = []
    bad: list[Bad] = []
    lines = index = 0
    for item in reader:
        if isinstance(item, Record):
            records.append(item)
        else:
            bad.append(item)
        lines += item.row is not None  # an empty file's note is no line
        if lines == size:
            yield index, records, bad, reader.position
            records, bad, lines, index = [], [], 0, index + 1
    if records or bad:
        yield index, records, bad, reader.position


class ChunkEmbedder(Embedder):
    """The library's Embedder, giving each text's token count with its vector."""

    def chunk(self, index: int, records: list[Record], bad: list[Bad], job: CorpusJob) -> Chunk:
        texts = [r.text for r in records]
        counts = np.zeros(len(texts), np.int32)
        if texts:
            options = EmbedOptions(job.dimensions, None, True, job.input_type, token_counts=counts)
            vectors = self._call(self._engine.embed(texts, options)).vectors
        else:  # every line of the chunk was bad
            vectors = np.zeros((0, job.dimensions or self.dimensions), np.float32)
        ids = [r.id for r in records]
        return Chunk(index, ids, [r.row for r in records], vectors, counts, bad)


class Prefetch(Generic[T]):
    """An iterator's items made on a thread of their own, one ahead of the caller."""

    def __init__(self, items: Iterator[T]) -> None:
        self._items = items
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="embedx-reader", daemon=True)

    def __enter__(self) -> Prefetch[T]:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()  # a read in progress ends at its next item; the thread is a daemon

    def _run(self) -> None:
        try:
            for item in self._items:
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


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM stops the job as Ctrl-C does: the chunk being written is finished, the rest
    dropped. (Only the main thread can take signals; elsewhere, nothing changes.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
