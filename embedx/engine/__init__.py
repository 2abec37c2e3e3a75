"""One model on every device it fits: loaded, fed by its converging queue, its rows finished."""

from embedx.engine.engine import Engine, EngineState, open_engine
from embedx.engine.named import NamedEngine
from embedx.engine.options import (
    EmbedOptions,
    EmbedResult,
    EngineOptions,
    ScoreOptions,
    ScoreResult,
)
from embedx.engine.sparse_rows import SparseRow

__all__ = [
    "EmbedOptions",
    "EmbedResult",
    "Engine",
    "EngineOptions",
    "EngineState",
    "NamedEngine",
    "ScoreOptions",
    "ScoreResult",
    "SparseRow",
    "open_engine",
]
