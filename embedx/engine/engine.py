"""Engine: one model replicated on N devices, fed by one converging queue; `await embed(texts)`
returns its vectors in order."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from embedx import heap
from embedx.devices import open_accelerator
from embedx.engine import outputs
from embedx.engine.loading import Placed, checked_length, open_tokenizer, place, unbuildable
from embedx.engine.options import (
    EmbedOptions,
    EmbedResult,
    EngineOptions,
    ScoreOptions,
    ScoreResult,
)
from embedx.engine.outputs import OutputSpec
from embedx.engine.probe import ProbePlan
from embedx.engine.replica import Replica, ReplicaModel
from embedx.engine.report import EngineReport, report_of
from embedx.engine.sparse_rows import settle_outputs
from embedx.engine.texts import Prompts, checked_scored, checked_texts
from embedx.engine.worker import DeviceWorker
from embedx.errors import (
    NoDeviceFits,
    PoolingRequired,
    ShuttingDown,
    SmokeTestFailed,
    WrongModelTask,
)
from embedx.models.catalog import ModelSpec
from embedx.models.chat_pairs import scored_inputs
from embedx.models.heads import ScoringModel
from embedx.models.loader import embedding_model
from embedx.models.pairs import reads_token_types
from embedx.models.pooling import Pooling
from embedx.models.task import ModelTask, task_of, with_pooling
from embedx.models.tokenizer import Encoded, Input, TextTokenizer
from embedx.scheduling import ConvergingQueue, Item, Job
from embedx.telemetry import INPUT_TOKEN_BUCKETS, LATENCY_BUCKETS_S, Histogram

if TYPE_CHECKING:
    import torch

    from embedx.devices import Accelerator, DeviceInfo
    from embedx.models.source import ModelFiles

log = logging.getLogger("embedx.engine")

# FlashAttention launches a block row per text, and CUDA allows 65535: batches stay below.
MAX_BATCH_TEXTS = 32768
SMOKE_TEXT = "embedx smoke test: the quick brown fox jumps over the lazy dog."


class EngineState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    CLOSED = "closed"


def _task(spec: ModelSpec, files: ModelFiles) -> tuple[ModelTask, bool]:
    """What the model is for, from its files, and whether its pairs carry token types: an
    embedding model must have its pooling stated (it is never guessed)."""
    try:
        stated = spec.pooling.value if spec.pooling else None
        task = with_pooling(task_of(files.config, files.directory), files.config, stated)
        token_types = task.kind == "score" and reads_token_types(files.config, files.directory)
    except Exception as exc:
        raise unbuildable(spec.name, exc) from exc
    if task.kind == "embed" and spec.pooling is None:
        raise PoolingRequired(
            f"model {spec.name!r} embeds texts and its pooling is unknown: state it (cls, mean "
            "or last_token) with its first request, or in its catalog entry. embedx never "
            "guesses pooling",
            param="pooling",
        )
    return task, token_types


def _check_task(engine: Engine, asked: str, name: str) -> None:
    """A request asks what the model is for (`asked`: embed, or score), by `name`."""
    task = "embed" if engine.task.kind == "sparse" else engine.task.kind  # its rows: sparse_rows
    if task != asked:
        does = "scores (query, document) pairs" if task == "score" else "embeds texts"
        wanted = "scoring pairs" if asked == "score" else "embedding texts"
        raise WrongModelTask(f"model {name!r} {does}; it is not for {wanted}", task=task)


Counts = np.ndarray | None  # (N,) ints where each input's token count is written, if given


def chunk_items(job: Job, start: int, encoded: Encoded, counts: Counts = None) -> list[Item]:
    """A tokenized chunk's texts as the job's items; `start` is its first text's index."""
    if counts is not None:
        counts[start : start + len(encoded.lengths)] = encoded.lengths
    views = zip(encoded.lengths, encoded.views(), strict=True)
    return [Item(job, start + i, n, ids) for i, (n, ids) in enumerate(views)]


class Engine:
    """One model on every device it fits on, fed by one converging queue."""

    def __init__(
        self,
        spec: ModelSpec,
        files: ModelFiles,
        tokenizer: TextTokenizer,
        task: ModelTask,
        pooling: Pooling | None,
        options: EngineOptions,
    ) -> None:
        self.spec = spec
        self.files = files
        self.tokenizer = tokenizer
        self.task = task
        self.pooling = pooling  # an embedding model's; a scorer reads its first token
        self.options = options
        self.prompts = Prompts.of(spec, files, options.wrapping)
        self.state = EngineState.LOADING
        self.max_batch_texts = min(options.max_batch_items or MAX_BATCH_TEXTS, MAX_BATCH_TEXTS)
        self.queue = ConvergingQueue(name=spec.name, max_batch_items=self.max_batch_texts)
        self.accelerators: list[Accelerator] = []  # every device it was given, used or not
        self.replicas: list[Replica] = []
        self.workers: list[DeviceWorker] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: asyncio.Future[None] | None = None
        self.dimensions = 0
        self.dtypes: dict[str, str] = {}
        self.truncated = 0
        self.requests = 0
        self.latency = Histogram(LATENCY_BUCKETS_S)
        self.input_tokens = Histogram(INPUT_TOKEN_BUCKETS)  # each text's, as it is embedded
        self._jobs_in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.skipped: dict[str, str] = {}  # device -> why the model is not on it
        self._holds_heap = False  # counted in `heap.hold` once loaded

    # -- loading -------------------------------------------------------------------------

    @classmethod
    async def load(
        cls,
        spec: ModelSpec,
        files: ModelFiles,
        accelerators: Sequence[Accelerator],
        options: EngineOptions,
    ) -> Engine:
        """Load the model on every device it fits, probe each, start the workers, smoke test.
        What the model is for (embedding texts, or scoring pairs) is read from its files.

        Nothing stays resident if any step fails."""
        task, token_types = _task(spec, files)
        pooling = Pooling.SPLADE if task.splade else spec.pooling if task.kind == "embed" else None
        prompted = Prompts.of(spec, files, options.wrapping).wraps
        length = checked_length(spec, task, pooling, files, prompted)
        tokenizer = await open_tokenizer(spec, files, length, task, token_types=token_types)
        engine = cls(spec, files, tokenizer, task, pooling, options)
        engine.accelerators = list(accelerators)  # closed with it

        def build(device: torch.device, dtype: str) -> ReplicaModel:
            if pooling is None:
                return ScoringModel(files, device, dtype, spec.implementation,
                                    task=task, token_types=token_types)  # fmt: skip
            return embedding_model(files, task, pooling, device, dtype, spec.implementation)

        try:
            for accelerator in accelerators:
                plan = ProbePlan.of(options, files, length, engine.max_batch_texts, accelerator)
                placed = await place(spec, files, build, accelerator, plan)
                if isinstance(placed, str):
                    engine.skipped[accelerator.info.label] = placed
                else:
                    engine._serve_on(placed)
            if not engine.replicas:
                reasons = "; ".join(f"{k}: {v}" for k, v in engine.skipped.items())
                raise NoDeviceFits(f"model {spec.name!r} fits on no device ({reasons})")
            engine._start_workers()
            engine.state = EngineState.READY
            if options.smoke_test:
                await _smoke_test(engine)
        except BaseException:
            await engine.close()
            raise
        # the model and everything loaded with it stay: stop scanning them (`heap.manage`)
        engine._holds_heap = heap.hold()
        return engine

    def _serve_on(self, placed: Placed) -> None:
        """Give a device the model was placed on its slot in the queue and its worker."""
        replica, probed = placed.replica, placed.probed
        info = replica.accelerator.info
        self.replicas.append(replica)
        self.dimensions = replica.model.dimensions
        self.dtypes[info.label] = placed.dtype
        slot = self.queue.add_device(
            info.label,
            budget=probed.budget,
            rate=1.0,
            max_inflight=replica.accelerator.max_inflight,
            probe=probed.points,
            launch_s=probed.launch_s,
            shares_host=not info.is_cuda,
        )
        self.workers.append(DeviceWorker(self.queue, replica, slot, self.options.batch_timeout_s))
        log.info(
            "%s on %s (%s): budget %d tokens, %.0f tokens/s, %.2f ms a batch",
            self.spec.name,
            info.label,
            placed.dtype,
            probed.budget,
            slot.speed.rate,
            slot.speed.fixed * 1000,
        )

    def _start_workers(self) -> None:
        for worker in self.workers:
            task = asyncio.create_task(worker.run(), name=f"embedx-{worker.slot.name}")
            task.add_done_callback(partial(self._worker_ended, worker))
            self._tasks.append(task)

    def _worker_ended(self, worker: DeviceWorker, task: asyncio.Task[None]) -> None:
        """A worker that died of an error nobody expected (a bug) takes its device out of
        service, so that its work goes to the others or fails, rather than waiting forever."""
        if task.cancelled() or (error := task.exception()) is None:
            return  # closed, or it returned after quarantining its device
        log.error("%s: the worker of %s failed", self.spec.name, worker.slot.name, exc_info=error)
        self.queue.quarantine(worker.slot, f"its worker failed: {error!r}")

    # -- embedding -----------------------------------------------------------------------

    def _check_ready(self) -> None:
        if self.state is not EngineState.READY:
            raise ShuttingDown(
                f"model {self.spec.name!r} is {self.state.value}: it was evicted or the server "
                "is shutting down while this request arrived; send it again"
            )

    async def embed(
        self,
        texts: Sequence[str],
        options: EmbedOptions | None = None,
        *,
        prompts: Prompts | None = None,
    ) -> EmbedResult:
        """Embed `texts`, wrapped in `prompts` (a name's, where several share these weights;
        else the engine's own); rows come back in their order. Cancelling drops the pending
        work."""
        options = options or EmbedOptions()
        prompts = prompts or self.prompts
        self._check_ready()
        _check_task(self, "embed", prompts.model)
        texts = checked_texts(texts)
        spec = outputs.settle(
            width=self.dimensions,
            model_normalizes=self.files.normalizes,
            default_normalize=self.options.normalize,
            dimensions=options.dimensions,
            normalize=options.normalize,
            encodings=options.encodings,
            sink=options.sink,
            multi=settle_outputs(self.task, prompts.model, options.outputs, options.top_k),
        )
        texts = prompts.wrap(texts, options.input_type, options.instruction)
        return await self._run(texts, spec, options.truncate, options.token_counts)

    async def score(
        self,
        inputs: Sequence[str | tuple[str, str]],
        options: ScoreOptions | None = None,
        *,
        name: str | None = None,
    ) -> ScoreResult:
        """Score (query, document) pairs, or single texts (a classifier's), for the model
        `name` (else the engine's); rows of scores, one per label, come back in their order.
        Cancelling drops the pending work."""
        options = options or ScoreOptions()
        self._check_ready()
        _check_task(self, "score", name or self.spec.name)
        pairs = scored_inputs(self.tokenizer, checked_scored(inputs), options.instruction)
        spec = outputs.scores(self.dimensions, "identity" if options.raw else self.task.activation)
        result = await self._run(pairs, spec, options.truncate)
        return ScoreResult(
            result.vectors, result.tokens, result.truncated, result.tokenize_s, result.total_s
        )

    async def _run(
        self, inputs: Sequence[Input], spec: OutputSpec, truncate: bool, counts: Counts = None
    ) -> EmbedResult:
        """The rows of `inputs` (texts, or pairs), finished as `spec` says."""
        started = time.monotonic()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        job = Job(len(inputs), future=done)
        rows = job.out = spec.rows(len(inputs))
        self._jobs_in_flight += 1
        self._idle.clear()
        try:
            truncated = await self._tokenize_into(job, inputs, truncate, counts)
            submitted = time.monotonic()
            await done
        except BaseException:
            self.queue.cancel(job)
            if done.done() and not done.cancelled():
                done.exception()  # failed while tokenizing: raised as the tokenizer's error
            raise
        finally:
            self._jobs_in_flight -= 1
            if not self._jobs_in_flight:
                self._idle.set()
        self.truncated += truncated
        self.requests += 1
        parts = outputs.by_encoding(rows.finished(), spec.encodings, spec.dimensions)
        now = time.monotonic()
        self.latency.observe(now - started)
        first = next(iter(parts.values()))
        return EmbedResult(first, job.tokens, truncated, submitted - started, now - started, parts,
                           **rows.extras())  # fmt: skip

    async def _tokenize_into(
        self, job: Job, texts: Sequence[Input], truncate: bool, counts: Counts
    ) -> int:
        """Tokenize chunk by chunk, submitting each as soon as it is ready: devices start on
        the first chunk while the rest is still being tokenized. Returns how many texts were
        truncated."""
        truncated = 0
        self.queue.feeding_started(job)
        try:
            chunks = self.tokenizer.encode_chunks(texts, truncate=truncate)
            async with contextlib.aclosing(chunks):
                async for start, encoded in chunks:
                    if job.cancelled:
                        break  # it failed meanwhile: its other texts need no tokenizing
                    with heap.gc_paused():
                        self.queue.submit(job, chunk_items(job, start, encoded, counts))
                    truncated += encoded.truncated
                    self.input_tokens.observe_all(encoded.lengths)
        finally:
            self.queue.feeding_done(job)
        return truncated

    # -- shutting down -------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> None:
        """Stop taking work and wait (up to `timeout_s`) for the work in flight, then close."""
        if self.state is EngineState.READY:
            self.state = EngineState.DRAINING
        slow = asyncio.get_running_loop().call_later(
            5.0, log.warning, "%s: draining is taking more than 5 s", self.spec.name
        )
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: see CpuAccelerator.result
                await self._idle.wait()  # returns at once when idle, even at timeout 0
        except TimeoutError:
            log.warning("%s: in-flight work did not finish in %.0f s", self.spec.name, timeout_s)
        finally:
            slow.cancel()
            await self.close(ShuttingDown("the server shut down before this request finished"))

    async def close(self, error: BaseException | None = None) -> None:
        """Stop the workers, fail what is still queued (with `error`, if given), and free
        every device's memory. A caller cancelled while it waits leaves the closing to finish
        all the same."""
        if self._closing is None:
            self.state = EngineState.CLOSED
            self._closing = asyncio.ensure_future(self._close(error))
        await asyncio.shield(self._closing)

    async def _close(self, error: BaseException | None) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.queue.close(error)
        self.tokenizer.close()
        self.replicas.clear()
        self.workers.clear()
        # emptying a GPU's cache waits for its stream, which other models share: not on the loop
        for accelerator in self.accelerators:
            await asyncio.to_thread(accelerator.close)
        if self._holds_heap:  # a load that failed never held it
            self._holds_heap = False
            heap.release()  # the next load, or the registry, freezes what is still alive

    # -- reporting -----------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """Whether any device still serves this model (not every one quarantined)."""
        return bool(self.queue.active_devices())

    def report(self) -> EngineReport:
        return report_of(self)

    def describe(self) -> dict[str, Any]:
        """The report, for /info."""
        return self.report().as_dict()


async def _smoke_test(engine: Engine) -> None:
    """One text (or pair) run through the loaded model: its row must be finite and not zero."""
    try:
        if engine.task.kind == "score":
            vectors = (await engine.score([(SMOKE_TEXT, SMOKE_TEXT)])).scores
        else:
            options = EmbedOptions(normalize=False, outputs=engine.task.outputs[:1])
            result = await engine.embed([SMOKE_TEXT], options)
            vectors = result.sparse[0].values[None] if result.sparse else result.vectors
    except Exception as exc:
        raise SmokeTestFailed(f"model {engine.spec.name!r} failed its smoke test: {exc}") from exc
    finally:  # no one's request: the counts of requests and their latency start after
        # it (the devices' counts of batches and tokens include its one batch)
        engine.requests = 0
        engine.latency = Histogram(LATENCY_BUCKETS_S)
        engine.input_tokens = Histogram(INPUT_TOKEN_BUCKETS)
    vector = vectors[0]
    if not np.isfinite(vector).all() or not np.any(vector):
        raise SmokeTestFailed(
            f"model {engine.spec.name!r} failed its smoke test: its vector is not finite or zero"
        )


async def open_engine(
    spec: ModelSpec,
    files: ModelFiles,
    devices: Sequence[DeviceInfo],
    options: EngineOptions,
    open_accelerator: Callable[[DeviceInfo], Accelerator] = open_accelerator,
) -> Engine:
    """The model of `spec` (its files resolved) loaded on every device of `devices` it fits."""
    return await Engine.load(spec, files, [open_accelerator(d) for d in devices], options)
