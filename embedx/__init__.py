"""embedx: text embeddings on every GPU of a host (and its CPU), one converging queue feeding them.

`import embedx` does not import torch; the Embedder loads it when a model loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from embedx.errors import EmbedxError  # every error embedx raises; no torch behind it

__version__ = "0.1.0"
__all__ = ["Embedder", "EmbedxError", "__version__"]

if TYPE_CHECKING:
    from embedx.embedder import Embedder


def __getattr__(name: str) -> Any:
    if name == "Embedder":
        from embedx.embedder import Embedder

        return Embedder
    raise AttributeError(f"module 'embedx' has no attribute {name!r}")
