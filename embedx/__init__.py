"""embedx: text embeddings on every GPU of a host (and its CPU), one converging queue feeding them.

`import embedx` does not import torch; an Embedder or Reranker loads it when its model loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from embedx.errors import EmbedxError  # every error embedx raises; no torch behind it

__version__ = "0.1.0"
__all__ = ["Embedder", "EmbedxError", "Reranker", "__version__"]

if TYPE_CHECKING:
    from embedx.embedder import Embedder
    from embedx.reranker import Reranker


def __getattr__(name: str) -> Any:
    if name == "Embedder":
        from embedx.embedder import Embedder

        return Embedder
    if name == "Reranker":
        from embedx.reranker import Reranker

        return Reranker
    raise AttributeError(f"module 'embedx' has no attribute {name!r}")
