"""Embedder: embed texts from scripts and notebooks, over one Engine on its own loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from embedx.engine import EmbedOptions
from embedx.errors import InvalidOption, PoolingRequired
from embedx.library import LocalModel, check_flag, check_unicode


class Embedder(LocalModel):
    """Embed texts with one model on every device it fits, from plain (non-async) code.

        with Embedder("sentence-transformers/all-MiniLM-L6-v2", pooling="mean") as e:
            vectors = e.embed(["first text", "second text"])  # (2, 384) float32

    The engine runs on an event loop in a background thread, so this also works inside a
    notebook whose own loop is running.
    """

    task = "embed"

    def _check_spec(self, model: str, pooled: bool, look_up: Any, spec: Any) -> None:
        if not pooled:
            look_up(model, spec)  # a wrong name is ModelNotFound, with a hint
            raise PoolingRequired(
                f"say how {model!r} pools: Embedder({model!r}, pooling='mean' | 'cls' | "
                "'last_token'). embedx never guesses pooling (a reranker is an embedx.Reranker)",
                param="pooling",
            )

    @property
    def dimensions(self) -> int:
        return self._engine.dimensions

    def embed(
        self,
        texts: Sequence[str] | str,
        *,
        dimensions: int | None = None,
        normalize: bool | None = None,
        input_type: str | None = None,
        truncate: bool = True,
        instruction: str | None = None,
        precision: str = "float32",
    ) -> np.ndarray:
        """(N, D) float32 vectors in the order of `texts` (a single string gives (1, D)).
        `input_type` picks the model's prompt (query, passage, document, Cohere's, or any
        prompt name of its own); `instruction` fills its query prompt's {instruction} slot.
        `precision` as sentence-transformers' `encode` takes it: int8 and uint8 give (N, D)
        of that type over the fixed range [-1, 1], binary and ubinary (N, D / 8) int8 and
        uint8 sign bits, after the `dimensions` cut and normalizing (docs/api.md).
        Interrupting it (Ctrl-C) drops the texts it has not embedded yet."""
        return self._call(
            self._embed(texts, dimensions, normalize, input_type, truncate, instruction, precision)
        )

    async def aembed(
        self,
        texts: Sequence[str] | str,
        *,
        dimensions: int | None = None,
        normalize: bool | None = None,
        input_type: str | None = None,
        truncate: bool = True,
        instruction: str | None = None,
        precision: str = "float32",
    ) -> np.ndarray:
        """`embed` for async code: awaits the engine on its own loop, from any other loop.
        Cancelling it drops the texts it has not embedded yet."""
        return await self._await(
            self._embed(texts, dimensions, normalize, input_type, truncate, instruction, precision)
        )

    async def _embed(
        self,
        texts: Sequence[str] | str,
        dimensions: int | None,
        normalize: bool | None,
        input_type: str | None,
        truncate: bool,
        instruction: str | None,
        precision: str,
    ) -> np.ndarray:
        batch = [texts] if isinstance(texts, str) else texts
        if isinstance(batch, Sequence):  # else the engine says what texts must be
            check_unicode(batch)
        check_flag("normalize", normalize, unset_ok=True)
        check_flag("truncate", truncate)
        options = EmbedOptions(
            dimensions,
            normalize,
            truncate,
            input_type,
            encodings=(_encoding(precision),),
            instruction=instruction,
        )
        return (await self._engine.embed(batch, options)).vectors


# sentence-transformers' precisions, as `encode` names them, and the engine's encodings
PRECISIONS = {"float32": "float", "int8": "int8", "uint8": "uint8", "binary": "binary",
              "ubinary": "ubinary"}  # fmt: skip


def _encoding(precision: object) -> str:
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise InvalidOption(
            f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}",
            param="precision",
        )
    return PRECISIONS[precision]
