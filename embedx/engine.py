"""Engine: one model replicated on N devices; `await embed(texts)` returns float32 vectors in order.

Each device has a DeviceWorker task that claims batches from the model's ConvergingQueue and
runs them through its accelerator: on CUDA, launched on the device's own stream with the
next batch launched before the current one is awaited; on the CPU, on one worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from embedx import heap
from embedx.devices import Accelerator, Launch, token_budget
from embedx.errors import (
    Bug,
    DeviceHung,
    EmbedxError,
    EmptyInput,
    InvalidInput,
    InvalidModel,
    InvalidOption,
    ModelUnavailable,
    NoDeviceFits,
    ShuttingDown,
    SmokeTestFailed,
)
from embedx.models import base64_rows
from embedx.models.catalog import ModelSpec, check_template
from embedx.models.loader import EmbeddingModel, dtype_on, max_tokens, weight_bytes
from embedx.models.packing import HostBatch, Staging, bucketed_rows, pack, to_device
from embedx.models.pooling import Pooling, check_dimensions, finish
from embedx.models.tokenizer import Encoded, TextTokenizer
from embedx.scheduling import FLOATS, Claim, ConvergingQueue, DeviceSlot, Item, Job, RowForm
from embedx.telemetry import LATENCY_BUCKETS_S, TOKEN_BUCKETS, Histogram

if TYPE_CHECKING:
    import torch

    from embedx.models.source import ModelFiles

log = logging.getLogger("embedx.engine")

HANG_FACTOR = 20  # a batch taking this many times its expected time marks its device hung
# The load's own batches (probes, timings) compile kernels and fill caches, and nothing is
# known of their expected time: never held to a deadline shorter than this.
WARM_UP_TIMEOUT_S = 60.0
# FlashAttention launches a block row per text, and CUDA allows 65535: batches stay below.
MAX_BATCH_TEXTS = 32768
SMOKE_TEXT = "embedx smoke test: the quick brown fox jumps over the lazy dog."


class EngineState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    CLOSED = "closed"


def _write_rows(job: Job, indices: np.ndarray, rows: np.ndarray, form: RowForm) -> None:
    """Put a batch's rows in their places in the job's output, finished here as the job
    wants them where the device did not (`form`: what the device made of them)."""
    if form.base64:  # then every job of the batch wanted just these rows
        job.out[indices] = rows
        return
    if job.form.unit and not form.unit:
        rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    job.out[indices] = base64_rows.encode_on_host(rows) if job.form.base64 else rows


def _base64_out(options: EmbedOptions, count: int, dimensions: int) -> np.ndarray:
    """The array a request's base64 rows are written into (`EmbedOptions.base64_out`)."""
    width = base64_rows.width(dimensions)
    if options.base64_out is None:
        return np.empty((count, width), np.uint8)
    return options.base64_out(count, width)


def _placed(options: EmbedOptions, encoded: np.ndarray) -> np.ndarray:
    """Rows encoded on the host, in the caller's array if it gave one (`base64_out`)."""
    if options.base64_out is None:
        return encoded
    out = options.base64_out(*encoded.shape)
    out[:] = encoded
    return out


def _prompts(spec: ModelSpec, files: ModelFiles) -> tuple[dict[str, str], str | None]:
    """A model's prompt templates by input type, and the input type it defaults to: its
    catalog entry's, else those of its sentence-transformers config, whose texts go before
    the input's, as sentence-transformers puts them."""
    if spec.prompts:
        return spec.prompts, spec.default_input_type
    prompts = {name: text + "{text}" for name, text in files.st_prompts.items()}
    if "passage" not in prompts and "document" in prompts:  # Qwen3's, for one
        prompts["passage"] = prompts["document"]
    return prompts, files.st_default_prompt


def _sole_job(items: Sequence[Item]) -> Job | None:
    """The one request every text of a batch belongs to (the common case), or None."""
    first = items[0].job
    return first if all(item.job is first for item in items) else None


def _batch_form(items: Sequence[Item], sole: Job | None) -> RowForm:
    """What the device makes of a batch's rows: what its requests want, where they agree;
    otherwise unit vectors if every request wants those, and floats."""
    if sole is not None:
        return sole.form
    forms = {job.form for job in {item.job for item in items}}  # jobs hash by identity: fast
    if len(forms) == 1:
        return forms.pop()
    return RowForm(unit=all(form.unit for form in forms))


def write_batch(items: Sequence[Item], sole: Job | None, rows: np.ndarray, form: RowForm) -> None:
    """Write a finished batch's rows into its live requests' outputs; `sole` is the one
    request of all its items, if there is one (`_sole_job`)."""
    if sole is not None:
        if not sole.cancelled:
            indices = np.fromiter((item.index for item in items), np.intp, len(items))
            _write_rows(sole, indices, rows, form)
        return
    for job, indices, picked in _by_job(items):
        _write_rows(job, indices, rows[picked], form)


def chunk_items(job: Job, start: int, encoded: Encoded) -> list[Item]:
    """A tokenized chunk's texts as the job's items; `start` is its first text's index."""
    views = zip(encoded.lengths, encoded.views(), strict=True)
    return [Item(job, start + i, n, ids) for i, (n, ids) in enumerate(views)]


@dataclass(slots=True)
class _InFlight:
    """A launched batch, with what its delivery needs to know about its requests."""

    claim: Claim
    launched: Launch[torch.Tensor]
    sole_job: Job | None  # the one request of all its texts, if there is just one
    form: RowForm  # what the device made of the rows


def _by_job(items: Sequence[Item]) -> list[tuple[Job, np.ndarray, np.ndarray]]:
    """The live jobs of a mixed batch, each with its items' indices and their rows."""
    grouped: dict[int, tuple[Job, list[int], list[int]]] = {}
    for row, item in enumerate(items):
        if item.job.cancelled:
            continue
        entry = grouped.get(id(item.job))
        if entry is None:
            entry = grouped[id(item.job)] = (item.job, [], [])
        entry[1].append(item.index)
        entry[2].append(row)
    return [(job, np.array(i, np.intp), np.array(r, np.intp)) for job, i, r in grouped.values()]


@dataclass(frozen=True, slots=True)
class EmbedOptions:
    dimensions: int | None = None
    normalize: bool | None = None  # None: the server's EMBEDX_NORMALIZE
    truncate: bool = True  # False: an over-long text is an error, not cut
    input_type: str | None = None  # picks a catalog prompt template: query or passage
    base64: bool = False  # rows as base64 of their float32 bytes (models/base64_rows.py)
    # With base64: makes the (N, width) uint8 array the rows are written into, such as a view
    # into a response laid out around them (server/embeddings.py); None: a new array.
    base64_out: Callable[[int, int], np.ndarray] | None = None


@dataclass(frozen=True, slots=True)
class EmbedResult:
    # (N, D) float32 in the caller's order; with `base64`, (N, width(D)) uint8 ASCII, in the
    # array `base64_out` made if one was given
    vectors: np.ndarray
    tokens: int
    truncated: int
    tokenize_s: float  # tokenizing and submitting (devices start on the first chunk meanwhile)
    total_s: float  # from the call to the vectors


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """What the engine takes from the settings."""

    normalize: bool = True
    wrapping: str | None = None
    max_batch_tokens: int = 16384
    max_batch_items: int | None = None
    device_batch_tokens: dict[str, int] | None = None
    batch_timeout_s: float = 60.0
    smoke_test: bool = True

    def __post_init__(self) -> None:
        if self.wrapping is not None:  # once here, not for every request
            check_template(self.wrapping, "wrapping")


class Replica:
    """A model on one device, with pinned staging memory for each batch it keeps in flight."""

    def __init__(self, accelerator: Accelerator, model: EmbeddingModel) -> None:
        self.accelerator = accelerator
        self.model = model
        cuda = accelerator.device.type == "cuda"
        self.staging = [Staging() for _ in range(accelerator.max_inflight)] if cuda else []

    def pack(self, token_ids: Sequence[np.ndarray], slot: int, budget: int) -> HostBatch:
        """On a GPU, in the slot's pinned memory and padded to a row count that was run at
        load (see packing.token_rows)."""
        if not self.staging:
            return pack(token_ids)
        return pack(token_ids, self.staging[slot], budget)

    def run(self, host: HostBatch, slot: int, form: RowForm = FLOATS) -> torch.Tensor:
        """Enqueue one batch (on the accelerator's stream): its rows, made into `form` there,
        land in host memory."""
        import torch
        import torch.nn.functional as F

        batch = to_device(host, self.accelerator.device)
        rows = self.model.forward(batch)  # (B, D) float32 on the device
        # on the device: the host thread has every other batch to feed
        if form.unit:
            rows = F.normalize(rows, dim=1, eps=1e-12)
        if form.base64:
            if self.accelerator.device.type == "cpu":  # its own thread: binascii beats torch
                return torch.from_numpy(base64_rows.encode_on_host(rows.numpy()))
            rows = base64_rows.encode_on_device(rows)
        if not self.staging:
            return rows
        out = self.staging[slot].output(len(rows), rows.shape[1], rows.dtype)
        out.copy_(rows, non_blocking=True)
        return out


def _unbuildable(name: str, error: Exception) -> Exception:
    """What a failure to build a model from its files is: embedx's own errors as they are;
    the device's or host's (a CUDA error, a read that failed, memory) a 503 to retry; any
    other (a config transformers does not know or that lacks a key, weights that are not
    safetensors inside) the model's fault, a 400; its traceback logged (INFO) either way."""
    if isinstance(error, InvalidModel) and error.param is None:  # raised deep in the loader
        return InvalidModel(f"model {name!r}: {error.message}", param="model")
    if isinstance(error, EmbedxError):
        return error
    # the caller gets the error; the traceback is for a server's log, at INFO so that a
    # library or CLI user with no logging set up sees the error alone, not it twice
    log.info("model %r could not be built", name, exc_info=error)
    detail = str(error).split("\n")[0][:300]
    if _host_fault(error):
        return ModelUnavailable(
            f"model {name!r} could not be loaded ({type(error).__name__}: {detail}): the "
            "device or host failed, not its files; try again"
        )
    return InvalidModel(
        f"model {name!r} could not be built from its files ({type(error).__name__}: {detail}); "
        "check its config.json and weights",
        param="model",
    )


def _host_fault(error: Exception) -> bool:
    """Whether a load failed for the device's or host's sake rather than its files'."""
    if isinstance(error, FileNotFoundError):  # a shard its index names is missing
        return False
    return isinstance(error, OSError | MemoryError) or "CUDA" in str(error)


class DeviceWorker:
    """Claims batches for one device and runs them, keeping up to `max_inflight` launched."""

    def __init__(self, engine: Engine, replica: Replica, slot: DeviceSlot) -> None:
        self.engine = engine
        self.replica = replica
        self.slot = slot
        self.queue = engine.queue
        self.batch_tokens = Histogram(TOKEN_BUCKETS)
        self.padding_rows = 0  # rows a GPU computed past the real tokens (bucketed counts)
        self._launches = 0

    async def run(self) -> None:
        accelerator = self.replica.accelerator
        inflight: list[_InFlight] = []
        try:
            while self.slot.active:
                while len(inflight) < accelerator.max_inflight:
                    claim = self.queue.claim(self.slot)
                    if claim is None:
                        break
                    sole = _sole_job(claim.items)
                    form = _batch_form(claim.items, sole)
                    launched = self._launch(claim, form)
                    if launched is None:  # its copies may still read the slot: not on the loop
                        await asyncio.to_thread(accelerator.synchronize)
                    else:
                        inflight.append(_InFlight(claim, launched, sole, form))
                if not inflight:
                    await self.queue.wait_for_work(self.slot)
                    continue
                batch = inflight[0]
                claim = batch.claim
                deadline = max(self.engine.options.batch_timeout_s, HANG_FACTOR * claim.expected_s)
                try:
                    output, seconds = await accelerator.result(batch.launched, deadline)
                except DeviceHung as exc:
                    log.error("%s", exc)
                    self.queue.quarantine(self.slot, str(exc))
                    return
                except Exception as exc:
                    inflight.pop(0)
                    self._failed(claim, exc)
                    continue
                inflight.pop(0)
                try:
                    self._deliver(batch, output, seconds)
                except Exception as exc:  # its rows could not be written: a failed batch
                    self._failed(claim, exc)
        finally:
            # Cancelled or quarantined: what this worker still holds goes back to the queue.
            for batch in inflight:
                self.queue.release(batch.claim)

    def _launch(self, claim: Claim, form: RowForm) -> Launch[torch.Tensor] | None:
        # With at most max_inflight batches out, the slot used max_inflight launches ago
        # belongs to a batch that is done. Only launches that happened count: after a failed
        # one, the next must not take the slot of a batch still running.
        slot = self._launches % self.replica.accelerator.max_inflight
        started = time.perf_counter()
        try:
            host = self.replica.pack([item.ids for item in claim.items], slot, self.slot.budget)
            launched = self.replica.accelerator.launch(lambda: self.replica.run(host, slot, form))
            self.padding_rows += host.rows - host.tokens
        except Exception as exc:
            self._failed(claim, exc)
            return None
        self._launches += 1
        self.slot.observe_launch(time.perf_counter() - started)
        return launched

    def _failed(self, claim: Claim, exc: Exception) -> None:
        oom = self.replica.accelerator.is_out_of_memory(exc)
        log.warning(
            "%s: batch of %d texts (%d tokens) failed%s: %r",
            self.slot.name,
            len(claim.items),
            claim.tokens,
            " (out of memory: halving its budget)" if oom else "",
            exc,
        )
        self.queue.fail(claim, exc, out_of_memory=oom)

    def _deliver(self, batch: _InFlight, output: torch.Tensor, seconds: float) -> None:
        claim = batch.claim
        if not self.queue.holds(claim):
            return  # revoked: the device was quarantined, others ran these items
        rows = output.numpy()  # host memory: pinned staging, valid until the next launch
        write_batch(claim.items, batch.sole_job, rows, batch.form)
        self.batch_tokens.observe(claim.tokens)
        self.queue.complete(claim, seconds)


class Engine:
    """One model on every device it fits on, fed by one converging queue."""

    def __init__(
        self,
        spec: ModelSpec,
        files: ModelFiles,
        tokenizer: TextTokenizer,
        pooling: Pooling,
        options: EngineOptions,
    ) -> None:
        self.spec = spec
        self.files = files
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.options = options
        self.prompts, self.default_input_type = _prompts(spec, files)
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

        Nothing stays resident if any step fails."""
        if spec.pooling is None:
            raise Bug("a model reached the engine without a pooling")
        try:
            limit = max_tokens(files, spec.implementation)
        except Exception as exc:
            raise _unbuildable(spec.name, exc) from exc
        if spec.max_seq_len is not None and spec.max_seq_len > limit:
            raise InvalidOption(
                f"max_seq_len {spec.max_seq_len} is more than model {spec.name!r} can read: "
                f"its position table holds {limit} tokens",
                param="max_seq_len",
            )
        if files.st_pooling not in (None, spec.pooling.value):  # stated, so never guessed
            log.warning(
                "model %r pools with %s as asked, but its sentence-transformers Pooling module "
                "states %s: its vectors will not be the ones it was trained to give",
                spec.name,
                spec.pooling.value,
                files.st_pooling,
            )
        if not files.st_pools_prompt and (spec.prompts or files.st_prompts or options.wrapping):
            log.warning(
                "model %r's sentence-transformers Pooling module leaves a prompt's tokens out "
                "of the mean (include_prompt false); embedx pools the whole wrapped text, so "
                "its vectors of prompted texts differ a little from sentence-transformers'",
                spec.name,
            )
        length = min(spec.max_seq_len or files.st_max_seq_len or limit, limit)
        try:
            tokenizer = await asyncio.to_thread(TextTokenizer, files, length)
        except Exception as exc:  # a tokenizer.json the tokenizers package cannot read
            raise _unbuildable(spec.name, exc) from exc
        engine = cls(spec, files, tokenizer, spec.pooling, options)
        engine.accelerators = list(accelerators)  # closed with it
        try:
            for accelerator in accelerators:
                await engine._add_device(accelerator)
            if not engine.replicas:
                reasons = "; ".join(f"{k}: {v}" for k, v in engine.skipped.items())
                raise NoDeviceFits(f"model {spec.name!r} fits on no device ({reasons})")
            engine._start_workers()
            engine.state = EngineState.READY
            if options.smoke_test:
                await engine._smoke_test()
        except BaseException:
            await engine.close()
            raise
        heap.hold()  # the model and everything loaded with it stay: stop scanning them
        engine._holds_heap = True
        return engine

    async def _add_device(self, accelerator: Accelerator) -> None:
        info = accelerator.info
        dtype = dtype_on(self.spec.dtype, info)
        try:
            needed = weight_bytes(self.files, dtype)
        except Exception as exc:
            raise _unbuildable(self.spec.name, exc) from exc
        free = accelerator.free_memory()
        if needed > free:
            self.skipped[info.label] = f"needs {needed >> 20} MiB, {free >> 20} MiB free"
            return
        # Out of memory skips the device; its cache is emptied only once the error is gone:
        # inside `except`, the traceback still holds the frames with the weights and batches.
        model: EmbeddingModel | None = None
        try:
            model = await asyncio.to_thread(
                EmbeddingModel,
                self.files,
                self.pooling,
                accelerator.device,
                dtype,
                self.spec.implementation,
            )
        except Exception as exc:
            if not accelerator.is_out_of_memory(exc):
                raise _unbuildable(self.spec.name, exc) from exc
        if model is None:
            await self._skip(accelerator, "out of memory while loading the weights")
            return
        replica = Replica(accelerator, model)
        fits = False
        try:
            budget, probe, launch_s = await self._probe(replica)
            for staging in replica.staging:  # pinned memory for the largest batch, no more
                width = base64_rows.width(model.dimensions)
                staging.reserve(budget, self._most_texts(budget), width)
            fits = True
        except Exception as exc:
            if not accelerator.is_out_of_memory(exc):
                raise _unbuildable(self.spec.name, exc) from exc
        if not fits:
            del replica, model  # before the cache is emptied: their memory goes with it
            await self._skip(accelerator, "out of memory running a probe batch beside the weights")
            return
        self.replicas.append(replica)
        self.dimensions = model.dimensions
        self.dtypes[info.label] = dtype
        slot = self.queue.add_device(
            info.label,
            budget=budget,
            rate=1.0,
            max_inflight=accelerator.max_inflight,
            probe=probe,
            launch_s=launch_s,
            shares_host=not info.is_cuda,
        )
        self.workers.append(DeviceWorker(self, replica, slot))
        log.info(
            "%s on %s (%s): budget %d tokens, %.0f tokens/s, %.2f ms a batch",
            self.spec.name,
            info.label,
            dtype,
            budget,
            slot.speed.rate,
            slot.speed.fixed * 1000,
        )

    async def _skip(self, accelerator: Accelerator, reason: str) -> None:
        self.skipped[accelerator.info.label] = reason
        # it synchronizes the device, whose other models' batches the loop must not wait on
        await asyncio.to_thread(accelerator.release_cached_memory)

    def _most_texts(self, budget: int) -> int:
        """The most texts a batch of `budget` tokens can hold: max_batch_texts, and half the
        budget, since texts have two tokens or more with special tokens."""
        return min(budget // 2, self.max_batch_texts)

    def _probe_batch(self, tokens: int, length: int) -> HostBatch:
        """Random texts of `length` tokens (the last one shorter), `tokens` rows in all."""
        vocab = int(self.files.config.get("vocab_size") or 1000)
        rng = np.random.default_rng(0)
        ids = rng.integers(min(100, vocab - 1), vocab, size=max(1, tokens), dtype=np.int32)
        return pack(np.split(ids, range(length, len(ids), length)))  # no staging: one at a time

    async def _probe(self, replica: Replica) -> tuple[int, list[tuple[float, float]], float]:
        """Measure activation bytes per token (for the budget), then the time of a small and
        a large batch (the scheduler's prior): returns the budget, (tokens, seconds)s, and
        the host seconds a launch took."""
        accelerator = replica.accelerator
        info = accelerator.info
        cap = self.options.max_batch_tokens
        length = min(self.tokenizer.max_seq_len, 512)
        per_token = 0.0
        if info.is_cuda:
            probe_tokens = min(cap, 8192)
            base = await asyncio.to_thread(accelerator.peak_memory, True)  # it synchronizes
            await self._timed(replica, self._probe_batch(probe_tokens, length))
            per_token = (accelerator.peak_memory() - base) / probe_tokens
        budget = token_budget(
            accelerator.free_memory(),
            per_token,
            accelerator.max_inflight,
            cap=cap,
            override=(self.options.device_batch_tokens or {}).get(info.key),
        )
        small = self._probe_batch(min(budget, 64), min(length, 32))
        large_tokens = budget if info.is_cuda else min(budget, 2048)
        large = self._probe_batch(large_tokens, min(length, 128))
        if info.is_cuda:
            # CUDA loads a kernel the first time it runs, and loading synchronizes the whole
            # device: run the shapes serving will meet now, not between two batches in flight.
            for width in sorted({min(w, length) for w in (8, 32, 128, 512, length)}):
                for tokens in (budget // 32, budget // 8, budget // 2, budget):
                    await self._timed(replica, self._probe_batch(max(tokens, width), width))
            # A matrix shape cuBLAS meets for the first time makes the host wait for the
            # device (bench/gemm_shapes.py): every row count a batch is padded to runs now.
            for rows in bucketed_rows(budget):
                await self._timed(replica, self._probe_batch(rows, min(length, 16)))
            if replica.model.one_row_per_text:  # every bucketed count of pooled rows
                texts = 64
                while texts <= max(64, self._most_texts(budget)):
                    await self._timed(replica, self._probe_batch(2 * texts, 2))
                    texts *= 2
        # warm-up: kernels (normalizing and encoding rows too), allocator
        await self._timed(replica, small, RowForm(unit=True, base64=True))
        points = []
        launches = []
        for batch in (small, large, small, large):
            seconds, launch_s = await self._timed(replica, batch)
            points.append((float(batch.tokens), seconds))
            launches.append(launch_s)
        return budget, points, min(launches)

    async def _timed(
        self, replica: Replica, host: HostBatch, form: RowForm = FLOATS
    ) -> tuple[float, float]:
        """The device seconds a batch took, and the host seconds its launch took."""
        accelerator = replica.accelerator
        started = time.perf_counter()
        launched = accelerator.launch(lambda: replica.run(host, 0, form))
        launch_s = time.perf_counter() - started
        deadline = max(self.options.batch_timeout_s, WARM_UP_TIMEOUT_S)
        _, seconds = await accelerator.result(launched, deadline)
        return seconds, launch_s

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

    async def _smoke_test(self) -> None:
        try:
            result = await self.embed([SMOKE_TEXT], EmbedOptions(normalize=False))
        except Exception as exc:
            raise SmokeTestFailed(f"model {self.spec.name!r} failed its smoke test: {exc}") from exc
        finally:  # no one's request: the counts of requests and their latency start after
            # it (the devices' counts of batches and tokens include its one batch)
            self.requests = 0
            self.latency = Histogram(LATENCY_BUCKETS_S)
        vector = result.vectors[0]
        if not np.isfinite(vector).all() or not np.any(vector):
            raise SmokeTestFailed(
                f"model {self.spec.name!r} failed its smoke test: its vector is not finite or zero"
            )

    # -- embedding -----------------------------------------------------------------------

    def _check_ready(self) -> None:
        if self.state is not EngineState.READY:
            raise ShuttingDown(
                f"model {self.spec.name!r} is {self.state.value}: it was evicted or the server "
                "is shutting down while this request arrived; send it again"
            )

    def template_for(self, input_type: str | None) -> str | None:
        """The template a request's texts go through: the model's prompt for its input type
        (or its default one, `_prompts`), else the server-wide wrapping."""
        prompts = self.prompts
        chosen = input_type or self.default_input_type
        if chosen is not None:
            if chosen not in prompts:
                known = ", ".join(sorted(prompts)) or "none"
                raise InvalidInput(
                    f"model {self.spec.name!r} has no prompt for input_type {chosen!r} "
                    f"(it has: {known})",
                    param="input_type",
                )
            return prompts[chosen]
        return self.options.wrapping

    async def embed(self, texts: Sequence[str], options: EmbedOptions | None = None) -> EmbedResult:
        """Embed `texts`; rows come back in their order. Cancelling drops the pending work."""
        options = options or EmbedOptions()
        self._check_ready()
        _check_texts(texts)
        texts = texts if isinstance(texts, list | tuple) else list(texts)  # sliced: a deque is not
        check_dimensions(options.dimensions, self.dimensions)
        template = self.template_for(options.input_type)
        if template is not None:
            # at the last "{text}": a catalog's template or the wrapping holds one (checked
            # at start), a sentence-transformers prompt put before it may hold another
            before, _, after = template.rpartition("{text}")
            texts = [before + text + after for text in texts]
        started = time.monotonic()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        job = Job(len(texts), future=done)
        normalize = self.options.normalize if options.normalize is None else options.normalize
        full_width = options.dimensions in (None, self.dimensions)
        # narrower rows are cut from the raw ones at the end, then normalized and encoded
        job.form = RowForm(
            unit=full_width and (normalize or self.files.normalizes),
            base64=full_width and options.base64,
        )
        if job.form.base64:
            job.out = _base64_out(options, len(texts), self.dimensions)
        else:
            job.out = np.empty((len(texts), self.dimensions), np.float32)
        self._jobs_in_flight += 1
        self._idle.clear()
        try:
            truncated = await self._tokenize_into(job, texts, options.truncate)
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
        vectors = job.out
        if not full_width:  # matryoshka: truncate the raw rows, then normalize
            vectors = finish(
                vectors,
                dimensions=options.dimensions,
                normalize=normalize,
                model_normalizes=self.files.normalizes,
            )
            if options.base64:
                vectors = _placed(options, base64_rows.encode_on_host(vectors))
        now = time.monotonic()
        self.latency.observe(now - started)
        return EmbedResult(vectors, job.tokens, truncated, submitted - started, now - started)

    async def _tokenize_into(self, job: Job, texts: Sequence[str], truncate: bool) -> int:
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
                        self.queue.submit(job, chunk_items(job, start, encoded))
                    truncated += encoded.truncated
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

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.spec.name,
            "state": self.state.value,
            "pooling": self.pooling.value,
            "implementation": self.replicas[0].model.implementation if self.replicas else None,
            "dimensions": self.dimensions,
            "max_seq_len": self.tokenizer.max_seq_len,
            "normalizes": self.files.normalizes,
            "source": self.files.origin,
            "revision": self.files.revision,
            "truncated_inputs": self.truncated,
            "requests": self.requests,
            "queue": {"items": self.queue.pending_items, "tokens": self.queue.pending_tokens},
            "tokenizer": {
                "calls": self.tokenizer.calls,
                "texts": self.tokenizer.texts,
                "busy_s": round(self.tokenizer.busy_s, 3),
                "collect_s": round(self.tokenizer.collect_s, 3),
                "idle_s": round(self.tokenizer.idle_seconds(), 3),
                "free_s": round(self.tokenizer.free_s, 3),
                "cut_at_chars": self.tokenizer.cut_at,
                "cut_then_retokenized": self.tokenizer.recut,
            },
            "devices": [
                {
                    "device": w.slot.name,
                    "dtype": self.dtypes.get(w.slot.name),
                    "state": w.slot.state.value,
                    "reason": w.slot.reason,
                    "budget_tokens": w.slot.budget,
                    "tokens_per_s": round(w.slot.speed.rate),
                    "fixed_ms": round(w.slot.speed.fixed * 1000, 3),
                    # how far batch times stray from that fit: high beside another tenant
                    "time_spread": round(w.slot.speed.spread, 3),
                    "tokens": w.slot.tokens_done,
                    "batches": w.slot.batches_done,
                    "busy_s": round(w.slot.busy_s, 3),
                    "launching_s": round(w.slot.launching_s, 4),  # host seconds, all launches
                    "padding_rows": w.padding_rows,
                }
                for w in self.workers
            ],
            "skipped_devices": self.skipped,
        }


def plain_texts(texts: Sequence[object]) -> bool:
    """Whether every item is a non-empty str: the usual call, checked without a Python step
    a text (anything else takes the detailed checks, which name the item at fault)."""
    return set(map(type, texts)) == {str} and "" not in texts


def _check_texts(texts: Sequence[str]) -> None:
    if isinstance(texts, str | bytes) or not isinstance(texts, Sequence):
        raise InvalidInput(
            f"texts must be a list of strings, not {type(texts).__name__}", param="input"
        )
    if not texts:
        raise EmptyInput("texts is empty: send at least one text", param="input")
    if plain_texts(texts):
        return
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInput(f"input {i} is a {type(text).__name__}, not a string", param="input")
        if not text:
            raise InvalidInput(f"input {i} is an empty string", param="input")
