"""Small batches replayed as CUDA graphs: a whole forward pass in one launch.

A few short texts cost a GPU microseconds, but an eager forward pass issues several kernels
a layer, each launched from Python: for online traffic the launches, not the GPU, set the
time (one 20-token text through MiniLM on an H200: 4.8 ms eager, 0.31 ms replayed). So when
a model loads on a GPU its forward pass is captured once for each of a set of shapes (rows,
texts); a batch that fits one is packed to that shape (packing.pack's `fit`) and replayed.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from embedx.models.packing import HostBatch, pack, packed_views

if TYPE_CHECKING:
    import torch

    from embedx.devices import CudaAccelerator
    from embedx.engine.replica import ReplicaModel

log = logging.getLogger("embedx.engine")

# Rows a graph holds, about 1.5x apart: a batch pads to less than 1.5x its tokens plus one.
GRAPH_ROWS = (64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


def graph_texts(count: int) -> int:
    """The texts of the graph a batch of `count` texts runs in: a power of four above it,
    so that one empty text is always left to hold the padding rows. Empty texts cost next
    to nothing (no rows; a pooled row each), so the steps can be coarse."""
    texts = 4
    while texts <= count:
        texts *= 4
    return texts


def graph_shapes(most_rows: int, most_texts: int) -> list[tuple[int, int]]:
    """Every (rows, texts) captured for batches up to `most_rows` tokens and `most_texts`
    texts. A text has two tokens at least (with its special tokens), so a graph of R rows
    needs at most R / 2 texts."""
    shapes = []
    for rows in GRAPH_ROWS:
        if rows > most_rows:
            break
        texts = 4
        while texts <= min(rows // 2, graph_texts(most_texts)):
            shapes.append((rows, texts))
            texts *= 4
    return shapes


def replays(model: ReplicaModel) -> bool:
    """Whether a model's forward pass can be captured: embedx's own code (transformers'
    branches on the batch in Python), with dense rows alone as its output."""
    from embedx.models.loader import EmbeddingModel

    return type(model) is EmbeddingModel and model.implementation != "transformers"


@dataclass(frozen=True, slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: torch.Tensor  # (3 * rows + texts + 1,) int32, as packing lays a batch out
    rows_out: torch.Tensor  # (texts, dimensions) float32


class CudaGraphs:
    """A model's graphs on one GPU, by shape."""

    def __init__(self, graphs: dict[tuple[int, int], _Graph]) -> None:
        self._graphs = graphs
        self._rows = sorted({rows for rows, _ in graphs})

    def __len__(self) -> int:
        return len(self._graphs)

    def fit(self, tokens: int, count: int) -> tuple[int, int] | None:
        """The shape a batch of `tokens` tokens in `count` texts runs in, or None (eager)."""
        at = bisect.bisect_right(self._rows, tokens)  # rows > tokens: one padding row at least
        if at == len(self._rows):
            return None
        shape = (self._rows[at], graph_texts(count))
        return shape if shape in self._graphs else None

    def replay(self, host: HostBatch) -> torch.Tensor:
        """Enqueue a batch packed to a graph's shape on the current stream: its (B, D) rows.

        They live in the graph's memory until its next replay, which the stream orders
        after whatever is enqueued now."""
        assert host.graph is not None, "a batch packed to no graph's shape"
        assert host.pinned is not None, "a graph takes batches staged in pinned memory"
        graph = self._graphs[host.graph]
        graph.inputs.copy_(host.pinned, non_blocking=True)
        graph.graph.replay()
        return graph.rows_out[: host.count]


async def capture(
    model: ReplicaModel, accelerator: CudaAccelerator, most_rows: int, most_texts: int
) -> CudaGraphs | None:
    """The model's forward pass captured for every shape up to `most_rows` rows, or None
    where it cannot be: the model then runs eagerly, as it does for larger batches."""
    shapes = graph_shapes(most_rows, most_texts)
    if not shapes or not replays(model):
        return None
    try:
        return await _captured(model, accelerator, shapes)
    except Exception:
        log.warning("CUDA graphs could not be captured: batches run eagerly", exc_info=True)
        return None


async def _captured(
    model: ReplicaModel, accelerator: CudaAccelerator, shapes: list[tuple[int, int]]
) -> CudaGraphs:
    """Each shape runs eagerly first (a new matrix shape makes cuBLAS wait for the device,
    which a capture must not), then is captured; the loop is let go between captures."""
    import torch

    device, stream = accelerator.device, accelerator.stream
    inputs = {shape: _placeholder(shape).to(device) for shape in shapes}

    def forward(shape: tuple[int, int]) -> torch.Tensor:
        rows, texts = shape
        return model.forward(packed_views(inputs[shape], rows, texts, rows, rows))

    for shape in shapes:  # each launch takes the loop a while: others' turns between
        with torch.cuda.device(device), torch.cuda.stream(stream):
            forward(shape)
        await asyncio.sleep(0)
    await asyncio.to_thread(stream.synchronize)
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[tuple[int, int], _Graph] = {}
    for shape in reversed(shapes):  # the largest first: the smaller reuse its memory
        with torch.cuda.device(device), torch.cuda.stream(stream):
            graph = torch.cuda.CUDAGraph()
            # thread-local: a tokenizer thread or another model's load may touch CUDA meanwhile
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                rows_out = forward(shape)
            finally:
                graph.capture_end()
        graphs[shape] = _Graph(graph, inputs[shape], rows_out)
        await asyncio.sleep(0)
    return CudaGraphs(graphs)


def _placeholder(shape: tuple[int, int]) -> torch.Tensor:
    """A batch of `shape` to capture with: one text of a few tokens, the rest empty."""
    import torch

    host = pack([np.full(2, 100, dtype=np.int32)], fit=lambda tokens, count: shape)
    return torch.from_numpy(host.buffer.copy())
