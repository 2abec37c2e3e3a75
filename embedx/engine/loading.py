"""Putting a model on devices: its length checked, its tokenizer opened, and on each device its
weights built and probed, or the reason it does not fit there."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from embedx.devices import Accelerator, CudaAccelerator
from embedx.engine import base64_rows, graphs
from embedx.engine.probe import Probed, ProbePlan, probe
from embedx.engine.replica import Replica, ReplicaModel
from embedx.errors import EmbedxError, InvalidModel, InvalidOption, ModelUnavailable
from embedx.models.catalog import ModelSpec
from embedx.models.chat_pairs import ChatPairTokenizer
from embedx.models.loader import dtype_on, max_tokens, weight_bytes
from embedx.models.pairs import pair_max_length
from embedx.models.pooling import Pooling
from embedx.models.source import ModelFiles
from embedx.models.task import ModelTask
from embedx.models.tokenizer import TextTokenizer

if TYPE_CHECKING:
    import torch

log = logging.getLogger("embedx.engine")


@dataclass(frozen=True, slots=True)
class Placed:
    """A model built and probed on one device."""

    replica: Replica
    dtype: str
    probed: Probed


def checked_length(
    spec: ModelSpec, task: ModelTask, pooling: Pooling | None, files: ModelFiles, prompted: bool
) -> int:
    """The tokens a text (or a pair) is cut to: the spec's, else what sentence-transformers
    cuts it to (its config's max_seq_length; a CrossEncoder's length), else what the model's
    position table holds. Warns where the model's files state otherwise than the spec
    (`prompted`: some template or prompt wraps its texts)."""
    try:
        limit = max_tokens(files, spec.implementation)
        stated = (
            pair_max_length(files.config, files.directory)
            if task.kind == "score"
            else files.st_max_seq_len
        )
    except Exception as exc:
        raise unbuildable(spec.name, exc) from exc
    if spec.max_seq_len is not None and spec.max_seq_len > limit:
        raise InvalidOption(
            f"max_seq_len {spec.max_seq_len} is more than model {spec.name!r} can read: "
            f"its position table holds {limit} tokens",
            param="max_seq_len",
        )
    if pooling is None:  # a scorer: its head reads the first token, as it was trained to
        return min(spec.max_seq_len or stated or limit, limit)
    if files.st_pooling not in (None, pooling.value):  # stated, so never guessed
        log.warning(
            "model %r pools with %s as asked, but its sentence-transformers Pooling module "
            "states %s: its vectors will not be the ones it was trained to give",
            spec.name,
            pooling.value,
            files.st_pooling,
        )
    if not files.st_pools_prompt and prompted:
        log.warning(
            "model %r's sentence-transformers Pooling module leaves a prompt's tokens out "
            "of the mean (include_prompt false); embedx pools the whole wrapped text, so "
            "its vectors of prompted texts differ a little from sentence-transformers'",
            spec.name,
        )
    return min(spec.max_seq_len or stated or limit, limit)


async def open_tokenizer(
    spec: ModelSpec, files: ModelFiles, length: int, task: ModelTask, *, token_types: bool
) -> TextTokenizer:
    """The model's tokenizer: of texts, of pairs, or of pairs rendered in its chat template (a
    causal-LM reranker's)."""
    pairs = task.kind == "score"
    opened: Callable[[], TextTokenizer] = partial(
        TextTokenizer, files, length, pairs=pairs, token_types=token_types
    )
    if task.logit_score is not None:
        opened = partial(ChatPairTokenizer, files, length)
    try:
        return await asyncio.to_thread(opened)
    except Exception as exc:  # a tokenizer.json the tokenizers package cannot read
        raise unbuildable(spec.name, exc) from exc


async def place(
    spec: ModelSpec,
    files: ModelFiles,
    build: Callable[[torch.device, str], ReplicaModel],
    accelerator: Accelerator,
    plan: ProbePlan,
) -> Placed | str:
    """The model built (`build(device, dtype)`) and probed on `accelerator`, or why it does
    not fit there."""
    info = accelerator.info
    dtype = dtype_on(spec.dtype, info)
    try:
        needed = weight_bytes(files, dtype)
    except Exception as exc:
        raise unbuildable(spec.name, exc) from exc
    free = accelerator.free_memory()
    if needed > free:
        return f"needs {needed >> 20} MiB, {free >> 20} MiB free"
    # Out of memory skips the device; its cache is emptied only once the error is gone:
    # inside `except`, the traceback still holds the frames with the weights and batches.
    model: ReplicaModel | None = None
    try:
        model = await _built(build, accelerator.device, dtype)
    except Exception as exc:
        if not accelerator.is_out_of_memory(exc):
            raise unbuildable(spec.name, exc) from exc
    if model is None:
        await _release(accelerator)
        return "out of memory while loading the weights"
    replica = Replica(accelerator, model)
    probed: Probed | None = None
    try:
        probed = await probe(replica, plan)
        if isinstance(accelerator, CudaAccelerator) and plan.graph_tokens:
            most_rows = min(plan.graph_tokens, probed.budget)
            most_texts = plan.most_texts(probed.budget)
            replica.graphs = await graphs.capture(model, accelerator, most_rows, most_texts)
        for staging in replica.staging:  # pinned memory for the largest batch, no more
            width = base64_rows.width(model.dimensions)
            staging.reserve(probed.budget, plan.most_texts(probed.budget), width)
    except Exception as exc:
        if not accelerator.is_out_of_memory(exc):
            raise unbuildable(spec.name, exc) from exc
    if probed is None:
        del replica, model  # before the cache is emptied: their memory goes with it
        await _release(accelerator)
        return "out of memory running a probe batch beside the weights"
    return Placed(replica, dtype, probed)


async def _built(
    build: Callable[[torch.device, str], ReplicaModel], device: torch.device, dtype: str
) -> ReplicaModel:
    """`build(device, dtype)` on a worker thread, handed over in a box: the thread's future
    would hold the model as its result until the thread lets go of it, in its own time, and a
    cache emptied while it does frees nothing."""
    box: list[ReplicaModel] = []
    await asyncio.to_thread(lambda: box.append(build(device, dtype)))
    return box.pop()


async def _release(accelerator: Accelerator) -> None:
    # it synchronizes the device, whose other models' batches the loop must not wait on
    await asyncio.to_thread(accelerator.release_cached_memory)


def unbuildable(name: str, error: Exception) -> Exception:
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
