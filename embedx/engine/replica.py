"""A model on one device: its batches packed (in pinned memory on a GPU), run, and finished
there."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from embedx.devices import Accelerator
from embedx.engine.compact_rows import Compactor, VocabRows
from embedx.engine.graphs import CudaGraphs
from embedx.engine.outputs import FLOATS, RowForm, finish_on_device
from embedx.models.packing import HostBatch, Staging, pack, to_device

if TYPE_CHECKING:
    import torch

    from embedx.models.packing import PackedBatch


class ReplicaModel(Protocol):
    """A model's weights on one device: an embedding model (models/loader.py) or a scorer
    (models/heads.py)."""

    dimensions: int  # a row's width: the embedding's, or the scorer's labels
    implementation: str  # whose code runs it: embedx's own for an architecture, or transformers
    one_row_per_text: bool  # the last layer runs for one token a text

    @property
    def matmuls(self) -> Callable[[int], None] | None:
        """One layer's projections for a number of token rows: at load, every matrix shape
        a padded row count meets, at a layer's cost rather than a forward's (probe.py);
        None where only a whole forward can (transformers' code)."""
        ...

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """(B, dimensions) float32 rows of a packed batch."""
        ...


@runtime_checkable
class ManyOutputs(Protocol):
    """A model that gives more than dense rows: SPLADE's (models/splade.py), BGE-M3's
    (models/m3.py)."""

    vocab_rows: bool  # its sparse rows are (B, V), cut by the engine (engine/compact_rows.py)

    def forward_outputs(
        self, batch: PackedBatch, outputs: tuple[str, ...], unit: bool
    ) -> torch.Tensor:
        """(N, W) float32: the batch's `outputs`, flat, as engine/sparse_rows.py reads them;
        its ColBERT vectors L2-normalized if `unit`."""
        ...


class Replica:
    """A model on one device, with pinned staging memory for each batch it keeps in flight."""

    def __init__(self, accelerator: Accelerator, model: ReplicaModel) -> None:
        self.accelerator = accelerator
        self.model = model
        vocab_rows = isinstance(model, ManyOutputs) and model.vocab_rows
        self.compactor = Compactor() if vocab_rows else None
        cuda = accelerator.device.type == "cuda"
        self.staging = [Staging() for _ in range(accelerator.max_inflight)] if cuda else []
        self.graphs: CudaGraphs | None = None  # captured at load where the model allows

    def pack(self, token_ids: Sequence[np.ndarray], slot: int, budget: int) -> HostBatch:
        """On a GPU, in the slot's pinned memory and padded to a row count that was run at
        load (see packing.token_rows), or to a CUDA graph's shape where one fits."""
        if not self.staging:
            return pack(token_ids)
        fit = self.graphs.fit if self.graphs is not None else None
        return pack(token_ids, self.staging[slot], budget, fit)

    def run(self, host: HostBatch, slot: int, form: RowForm = FLOATS) -> torch.Tensor:
        """Enqueue one batch (on the accelerator's stream): its rows, made into `form` there,
        land in host memory."""
        vocab_rows = None
        if form.outputs == FLOATS.outputs:
            if host.graph is not None:  # packed to a shape captured at load (graphs.py)
                assert self.graphs is not None
                dense = self.graphs.replay(host)
            else:
                dense = self.model.forward(to_device(host, self.accelerator.device))
            rows = finish_on_device(dense, form)  # (B, D) float32 in
        else:  # a block of several outputs (engine/sparse_rows.py)
            assert isinstance(self.model, ManyOutputs), "outputs asked of a dense model: a bug"
            batch = to_device(host, self.accelerator.device)
            rows = self.model.forward_outputs(batch, form.outputs, form.unit)
            if self.compactor is not None:  # SPLADE's (B, V): each row's non-zeros leave
                vocab_rows, rows = rows, self.compactor.cut(rows, form.top_k)
        out = rows
        if self.staging:
            out = self.staging[slot].output(len(rows), rows.shape[1], rows.dtype)
            out.copy_(rows, non_blocking=True)
        if vocab_rows is not None:
            assert self.compactor is not None
            self.compactor.keep(slot, out, vocab_rows)
        return out

    def taken(self, out: torch.Tensor) -> VocabRows | None:
        """A delivered batch's SPLADE rows, read from its output (`run`'s, now finished);
        None for any other batch."""
        return None if self.compactor is None else self.compactor.taken(out)
