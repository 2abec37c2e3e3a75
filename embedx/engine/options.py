"""The engine's records: what it takes from the settings, what a request asks of its texts'
embedding or its pairs' scores, and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from embedx.engine.outputs import FLOAT, RowSink
from embedx.engine.sparse_rows import DENSE, SparseRow
from embedx.models.catalog import check_template

if TYPE_CHECKING:
    from embedx.config import Settings


@dataclass(frozen=True, slots=True)
class EmbedOptions:
    """What a request asks of its texts' embedding, beyond the texts."""

    dimensions: int | None = None
    normalize: bool | None = None  # None: the server's EMBEDX_NORMALIZE
    truncate: bool = True  # False: an over-long text is an error, not cut
    input_type: str | None = None  # picks a prompt (models/prompts.py's INPUT_TYPES)
    # how rows are given (outputs.ENCODINGS: float, base64, int8, uint8, binary, ubinary)
    encodings: tuple[str, ...] = FLOAT
    sink: RowSink | None = None  # with base64 alone: where the rows go (outputs.RowSink)
    instruction: str | None = None  # fills the prompt's {instruction} slot; None: its default
    token_counts: np.ndarray | None = None  # (N,) ints: each text's tokens are written here
    outputs: tuple[str, ...] = DENSE  # sparse_rows.OUTPUTS: dense, sparse, colbert
    top_k: int | None = None  # a sparse row keeps its k largest weights


@dataclass(frozen=True, slots=True)
class EmbedResult:
    # (N, D) float32 in the caller's order; encoded, the first encoding's rows: base64's
    # (N, width(D)) uint8 ASCII, in the array the sink made if one was given, int8's (N, D)
    # int8, binary's (N, D / 8) int8...
    vectors: np.ndarray
    tokens: int
    truncated: int
    tokenize_s: float  # tokenizing and submitting (devices start on the first chunk meanwhile)
    total_s: float  # from the call to the vectors
    encoded: dict[str, np.ndarray] = field(default_factory=dict)  # each encoding's rows
    sparse: list[SparseRow] | None = None  # each text's sparse row, where asked
    colbert: list[np.ndarray] | None = None  # each text's (tokens - 1, C) ColBERT vectors


@dataclass(frozen=True, slots=True)
class ScoreOptions:
    """What a request asks of its pairs' scores, beyond the pairs."""

    truncate: bool = True  # False: an over-long pair is an error, not cut
    raw: bool = False  # the logits, not the model's activation of them
    instruction: str | None = None  # a causal-LM reranker's system prompt; None: its default


@dataclass(frozen=True, slots=True)
class ScoreResult:
    scores: np.ndarray  # (N, labels) float32 in the caller's order
    tokens: int
    truncated: int
    tokenize_s: float
    total_s: float


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """What the engine takes from the settings."""

    normalize: bool = True
    wrapping: str | None = None
    max_batch_tokens: int = 262144
    max_batch_items: int | None = None
    cuda_graph_tokens: int = 2048
    device_batch_tokens: dict[str, int] | None = None
    batch_timeout_s: float = 60.0
    smoke_test: bool = True

    def __post_init__(self) -> None:
        if self.wrapping is not None:  # once here, not for every request
            check_template(self.wrapping, "wrapping")

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineOptions:
        return cls(
            normalize=settings.normalize,
            wrapping=settings.wrapping,
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_items=settings.max_batch_items,
            cuda_graph_tokens=settings.cuda_graph_tokens,
            device_batch_tokens=settings.device_batch_tokens,
            batch_timeout_s=settings.batch_timeout_s,
            smoke_test=settings.smoke_test_on_load,
        )
