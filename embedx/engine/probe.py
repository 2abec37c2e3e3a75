"""Measuring a model on a device at load: activation memory per token (its token budget), the
time of a small and a large batch (the scheduler's prior), and every batch shape serving will
meet, run once so that none makes the host wait later."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import partial

import numpy as np

from embedx.devices import Accelerator, token_budget
from embedx.engine.options import EngineOptions
from embedx.engine.outputs import ENCODINGS, FLOATS, RowForm
from embedx.engine.replica import Replica
from embedx.models.packing import HostBatch, bucketed_rows, pack
from embedx.models.source import ModelFiles

# The load's own batches compile kernels and fill caches, and nothing is known of their
# expected time: never held to a deadline shorter than this.
WARM_UP_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Probed:
    """What probing a model on a device found."""

    budget: int  # tokens a batch may hold there
    points: list[tuple[float, float]]  # (tokens, seconds) of the timed batches
    launch_s: float  # host seconds a launch took, at best


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """What the probe needs to know of the model and the settings."""

    length: int  # the model's max_seq_len
    vocab: int
    max_batch_tokens: int  # the cap on any device's budget
    budget_override: int | None  # EMBEDX_DEVICE_BATCH_TOKENS for this device
    max_batch_texts: int
    batch_timeout_s: float
    graph_tokens: int = 0  # the largest batch a GPU replays as a CUDA graph (graphs.py)

    @classmethod
    def of(
        cls,
        options: EngineOptions,
        files: ModelFiles,
        length: int,
        max_batch_texts: int,
        accelerator: Accelerator,
    ) -> ProbePlan:
        """The plan for a model of `length` tokens on `accelerator`, as the settings say."""
        return cls(
            length=length,
            vocab=int(files.config.get("vocab_size") or 1000),
            max_batch_tokens=options.max_batch_tokens,
            budget_override=(options.device_batch_tokens or {}).get(accelerator.info.key),
            max_batch_texts=max_batch_texts,
            batch_timeout_s=options.batch_timeout_s,
            graph_tokens=options.cuda_graph_tokens,
        )

    def most_texts(self, budget: int) -> int:
        """The most texts a batch of `budget` tokens can hold: max_batch_texts, and half the
        budget, since texts have two tokens or more with special tokens."""
        return min(budget // 2, self.max_batch_texts)


async def probe(replica: Replica, plan: ProbePlan) -> Probed:
    """Measure activation bytes per token (for the budget), then the time of a small and a
    large batch (the scheduler's prior)."""
    accelerator = replica.accelerator
    info = accelerator.info
    cap = plan.max_batch_tokens
    length = min(plan.length, 512)
    per_token = 0.0
    if info.is_cuda:
        probe_tokens = min(cap, 8192)
        base = await asyncio.to_thread(accelerator.peak_memory, True)  # it synchronizes
        await timed(replica, _batch(plan, probe_tokens, length), plan)
        per_token = (accelerator.peak_memory() - base) / probe_tokens
    budget = token_budget(
        accelerator.free_memory(),
        per_token,
        accelerator.max_inflight,
        cap=cap,
        override=plan.budget_override,
    )
    small = _batch(plan, min(budget, 64), min(length, 32))
    large_tokens = budget if info.is_cuda else min(budget, 2048)
    large = _batch(plan, large_tokens, min(length, 128))
    if info.is_cuda:
        # CUDA loads a kernel the first time it runs, and loading synchronizes the whole
        # device: run the shapes serving will meet now, not between two batches in flight.
        for width in sorted({min(w, length) for w in (8, 32, 128, 512, length)}):
            for tokens in (budget // 32, budget // 8, budget // 2, budget):
                await timed(replica, _batch(plan, max(tokens, width), width), plan)
        # A matrix shape cuBLAS meets for the first time makes the host wait for the
        # device: every row count a batch is padded to meets them now. One layer's
        # projections do it where the model gives them: a whole forward of each of the 192
        # counts up to 262,144 rows is 9.6M tokens, 12 s of BERT-large at 816k tok/s.
        matmuls = replica.model.matmuls
        for rows in bucketed_rows(budget):
            if matmuls is None:
                await timed(replica, _batch(plan, rows, min(length, 16)), plan)
            else:
                launched = accelerator.launch(partial(matmuls, rows))
                await accelerator.result(launched, WARM_UP_TIMEOUT_S)
        if replica.model.one_row_per_text:  # every bucketed count of pooled rows
            texts = 64
            while texts <= max(64, plan.most_texts(budget)):
                await timed(replica, _batch(plan, 2 * texts, 2), plan)
                texts *= 2
    # warm-up: kernels (normalizing and encoding rows too), allocator
    await timed(replica, small, plan, RowForm(unit=True, encodings=tuple(ENCODINGS)))
    points = []
    launches = []
    for batch in (small, large, small, large):
        seconds, launch_s = await timed(replica, batch, plan)
        points.append((float(batch.tokens), seconds))
        launches.append(launch_s)
    return Probed(budget, points, min(launches))


def _batch(plan: ProbePlan, tokens: int, length: int) -> HostBatch:
    """Random texts of `length` tokens (the last one shorter), `tokens` rows in all."""
    vocab = plan.vocab
    rng = np.random.default_rng(0)
    ids = rng.integers(min(100, vocab - 1), vocab, size=max(1, tokens), dtype=np.int32)
    return pack(np.split(ids, range(length, len(ids), length)))  # no staging: one at a time


async def timed(
    replica: Replica, host: HostBatch, plan: ProbePlan, form: RowForm = FLOATS
) -> tuple[float, float]:
    """The device seconds a batch took, and the host seconds its launch took."""
    accelerator = replica.accelerator
    started = time.perf_counter()
    launched = accelerator.launch(lambda: replica.run(host, 0, form))
    launch_s = time.perf_counter() - started
    deadline = max(plan.batch_timeout_s, WARM_UP_TIMEOUT_S)
    _, seconds = await accelerator.result(launched, deadline)
    return seconds, launch_s
