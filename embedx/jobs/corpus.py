"""The corpus job, `embedx embed MODEL INPUT... -o OUTPUT`: chunks of texts read ahead on one
thread, several at a time in the engine (every device, through the library) so that it never
waits at a chunk's end, each written as it comes back (`writing`; .npy and safetensors joined
from the chunks once all are done)."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import numpy as np

from embedx.config import Settings
from embedx.embedder import Embedder
from embedx.engine import EmbedOptions
from embedx.errors import EmbedxError, InvalidInput, PoolingRequired
from embedx.jobs.inputs import Bad, Fields, Reader, Records, Shard, shards
from embedx.jobs.parts import Chunk, WorkFolder
from embedx.jobs.progress import Progress
from embedx.jobs.results import StreamedParquet, join, output_format, write_bad
from embedx.jobs.threads import Prefetch
from embedx.jobs.writing import Writes
from embedx.library import waited

# Texts a chunk. Each is one engine request and one synced part: on an H100, MiniLM's job
# ran 10 to 25% faster at 16,384 than at 4,096 (fewer, larger tokenizer calls; a quarter of
# the syncs), BERT-large's the same (bench/results/corpus.md). The devices wait for the
# first chunk's reading and the last one's writing, a few tens of ms at this size.
CHUNK_TEXTS = 16384
# Chunks waiting in the engine's queue behind the one it embeds: at a chunk's end its devices
# go on to the next while the main thread takes the chunk back and sends another.
AHEAD = 2


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


@dataclass(slots=True)
class Stages:
    """Where a run's seconds went (bench/corpus.py shows them). Reading and writing run on
    threads of their own beside the embedding: the devices wait only for the first chunk to
    be read (`first_s`, from the call: with a model given, else its loading too) and, after
    the last came back, for its writes and the output to be put in place (`last_s`);
    `embed_s` lies between. `read_s`, `part_s` and `output_s` are the reading and writing
    threads' busy seconds."""

    first_s: float = 0.0
    embed_s: float = 0.0
    last_s: float = 0.0
    read_s: float = 0.0
    part_s: float = 0.0
    output_s: float = 0.0


def run(
    job: CorpusJob,
    settings: Settings,
    stream: TextIO = sys.stderr,
    embedder: ChunkEmbedder | None = None,
    stages: Stages | None = None,
) -> str:
    """Embed every text of the job's inputs into its output; returns the summary line. With
    `embedder` (a model already loaded), the job's model and pooling are its, and it is left
    open. `stages`, if given, is filled in."""
    started = time.perf_counter()
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
            Prefetch(chunks(reader, job.chunk_texts), "embedx-reader") as incoming,
        ):
            width = job.dimensions or embedder.dimensions
            if output_format(job.output) == "parquet":
                streamed = StreamedParquet(work.path / ".output.tmp", width)
            progress.start()  # the model is loaded: the clock is the embedding's
            with (
                Writes(work, streamed) as writes,
                InEngine(embedder, job, writes, progress) as sent,
            ):
                for read in incoming:
                    if read.index in finished:
                        sent.resumed(read.position, finished[read.index])
                    elif read.bad and not job.skip_bad:
                        sent.land_all()  # the chunks before it are kept
                        raise InvalidInput(
                            f"{read.bad[0].message()} (--skip-bad embeds the rest and lists "
                            f"such lines in {job.bad_file})"
                        )
                    else:
                        sent.send(read)
                sent.land_all()
                writes.finish()
    finally:
        progress.close()
        if streamed is not None:
            streamed.close()  # stopped: what it wrote goes with the next run's open()
    parts = list(work.parts().values())
    if streamed is None or not streamed.finish(job.output):
        join(parts, job.output, width, work.path / ".output.tmp")
    bad_lines = write_bad(parts, job.bad_file)
    work.remove()
    if stages is not None:
        ended = time.perf_counter()
        first, last = sent.first_sent or ended, sent.last_back or ended
        stages.first_s, stages.embed_s, stages.last_s = first - started, last - first, ended - last
        stages.read_s = incoming.busy_s
        stages.part_s, stages.output_s = writes.part_s, writes.output_s
    return progress.summary(str(job.output), bad_lines, str(job.bad_file))


@dataclass(slots=True)
class ReadChunk:
    """A chunk as read: its good lines' texts, ids and row numbers, its bad lines, how many
    lines in all, and how far into the inputs (bytes read) it ends."""

    index: int
    texts: list[str] = field(default_factory=list)
    ids: list[str | int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    bad: list[Bad] = field(default_factory=list)
    lines: int = 0
    position: int = 0

    def add(self, item: Records | Bad, at: int, size: int) -> int:
        """Add `item`'s lines from its `at`-th on, until the chunk holds `size`; returns where
        in the item it stopped."""
        if isinstance(item, Bad):
            self.bad.append(item)
            self.lines += item.row is not None  # an empty file's note is no line
            return 1
        end = min(len(item.texts), at + size - self.lines)
        self.texts += item.texts[at:end]
        self.ids += item.ids[at:end]
        self.rows += range(item.row + at, item.row + end)
        self.lines += end - at
        return end


def chunks(reader: Reader, size: int) -> Iterator[ReadChunk]:
    """Every `size` lines of the inputs as a chunk, in order."""
    read = ReadChunk(0)
    for item in reader:
        at, length = 0, len(item.texts) if isinstance(item, Records) else 1
        while at < length:
            at = read.add(item, at, size)
            if read.lines == size:
                read.position = reader.position
                yield read
                read = ReadChunk(read.index + 1)
    if read.texts or read.bad:
        read.position = reader.position
        yield read


class InEngine:
    """The chunks sent to the engine and not yet back, oldest first. Each is taken back in
    order and written, while AHEAD more wait in the engine's queue behind the one it embeds;
    chunks an earlier run finished take their turn among them.

    Leaving cancels what is still in the engine (the job stopped or failed)."""

    def __init__(
        self, embedder: ChunkEmbedder, job: CorpusJob, writes: Writes, progress: Progress
    ) -> None:
        self.first_sent: float | None = None
        self.last_back: float | None = None
        self._embedder = embedder
        self._job = job
        self._writes = writes
        self._progress = progress
        self._pending: deque[tuple[int, Future[Chunk] | Path]] = deque()  # (position, ...)
        self._embedding = 0

    def __enter__(self) -> InEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for _, sent in self._pending:
            if isinstance(sent, Future):
                sent.cancel()

    def send(self, read: ReadChunk) -> None:
        """Start embedding a chunk; take back the oldest if more than AHEAD wait behind it."""
        self._pending.append((read.position, self._embedder.submit(read, self._job)))
        self._embedding += 1
        if self.first_sent is None:
            self.first_sent = time.perf_counter()
        while self._embedding > AHEAD:
            self._land()

    def resumed(self, position: int, part: Path) -> None:
        """A chunk an earlier run finished, ending at byte `position` of the inputs."""
        self._pending.append((position, part))
        if self._embedding == 0:  # none before it: its turn is now
            self._land()

    def land_all(self) -> None:
        while self._pending:
            self._land()

    def _land(self) -> None:
        position, sent = self._pending.popleft()
        if isinstance(sent, Path):
            self._progress.skipped(position)
            self._writes.resumed(sent)
            return
        chunk = waited(sent)
        self._embedding -= 1
        self.last_back = time.perf_counter()
        self._writes.chunk(chunk)
        self._progress.advance(position, len(chunk.ids), int(chunk.tokens.sum()))
        while self._pending and isinstance(self._pending[0][1], Path):
            self._land()  # finished chunks behind it: their turn is now


class ChunkEmbedder(Embedder):
    """The library's Embedder, embedding a job's chunks several at a time, each text's token
    count given with its vector."""

    def submit(self, read: ReadChunk, job: CorpusJob) -> Future[Chunk]:
        """Start embedding a chunk; it comes back in the future, which cancelled cancels it."""
        counts = np.zeros(len(read.texts), np.int32)
        if not read.texts:  # every line of the chunk was bad
            empty: Future[Chunk] = Future()
            vectors = np.zeros((0, job.dimensions or self.dimensions), np.float32)
            empty.set_result(Chunk(read.index, [], [], vectors, counts, read.bad))
            return empty
        options = EmbedOptions(job.dimensions, None, True, job.input_type, token_counts=counts)
        return self._start(self._chunk(read, options, counts))

    async def _chunk(self, read: ReadChunk, options: EmbedOptions, counts: np.ndarray) -> Chunk:
        vectors = (await self._engine.embed(read.texts, options)).vectors
        return Chunk(read.index, read.ids, read.rows, vectors, counts, read.bad)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM stops the job as Ctrl-C does: the chunks back from the engine are written, those
    still in it dropped. (Only the main thread can take signals; elsewhere, nothing changes.)"""
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
