"""embedx: text embeddings on every GPU of a host (and its CPU), one converging queue feeding them.

`import embedx` does not import torch; an Embedder or Reranker loads it when its model loads.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# oneDNN, which runs torch's matrix products on the CPU, caches a primitive for each input
# shape it meets (1,024 by default), and batches of texts come in every shape: a CPU
# process grew from 481 to 2,060 MB over 240 requests; with no cache, 445 to 534 MB, no
# slower (MiniLM, 100 texts a request). Read when torch first runs one; a value already set wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")

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
