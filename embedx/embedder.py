"""Embedder: embed texts from scripts and notebooks, over one Engine on its own loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from embedx.engine import EmbedOptions, SparseRow
from embedx.errors import InvalidOption, PoolingRequired
from embedx.library import LocalModel, check_flag, check_unicode


class Embedder(LocalModel):
    """Embed texts with one model on every device it fits, from plain (non-async) code.

        with Embedder("sentence-transformers/all-MiniLM-L6-v2", pooling="mean") as e:
            vectors = e.embed(["first text", "second text"])  # (2, 384) float32

    A SPLADE model's rows come from `embed_sparse`; BGE-M3's dense, sparse and ColBERT rows
    from `embed_outputs`.

    The engine runs on an event loop in a background thread, so this also works inside a
    notebook whose own loop is running.
    """

    task = "embed"

    def _check_spec(self, model: str, pooled: bool, look_up: Any, spec: Any) -> None:
        if not pooled:
            look_up(model, spec)  # a wrong name is ModelNotFound, with a hint
            if _states_sparse(spec):  # a SparseEncoder's files state its pooling
                return
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

    def embed_sparse(
        self,
        texts: Sequence[str] | str,
        *,
        top_k: int | None = None,
        input_type: str | None = None,
        truncate: bool = True,
        instruction: str | None = None,
    ) -> list[SparseRow]:
        """Each text's sparse row (token ids ascending, their weights): a SPLADE model's, as
        sentence-transformers' SparseEncoder.encode gives it, or BGE-M3's lexical weights.
        `top_k` keeps each row's k largest weights."""
        result = self.embed_outputs(texts, ("sparse",), top_k=top_k, input_type=input_type,
                                    truncate=truncate, instruction=instruction)  # fmt: skip
        rows: list[SparseRow] = result["sparse"]
        return rows

    def embed_outputs(
        self,
        texts: Sequence[str] | str,
        outputs: Sequence[str] = ("dense", "sparse", "colbert"),
        *,
        top_k: int | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        input_type: str | None = None,
        truncate: bool = True,
        instruction: str | None = None,
    ) -> dict[str, Any]:
        """Any of a model's outputs from one pass over `texts`, by name: "dense" (N, D) float32,
        "sparse" a SparseRow a text, "colbert" a (tokens - 1, C) float32 array a text
        (BGE-M3's, normalized as its dense rows are). A model lacking one is an error."""
        batch = [texts] if isinstance(texts, str) else texts
        if isinstance(batch, Sequence):
            check_unicode(batch)
        check_flag("normalize", normalize, unset_ok=True)
        check_flag("truncate", truncate)
        wanted = (outputs,) if isinstance(outputs, str) else tuple(outputs)
        options = EmbedOptions(dimensions, normalize, truncate, input_type,
                               instruction=instruction, outputs=wanted, top_k=top_k)  # fmt: skip
        result = self._call(self._engine.embed(batch, options))
        found = {"dense": result.vectors, "sparse": result.sparse, "colbert": result.colbert}
        return {name: found[name] for name in wanted}


def _states_sparse(spec: Any) -> bool:
    """Whether the model's own files say it is a SPLADE SparseEncoder."""
    from embedx.models.source import resolve
    from embedx.models.task import saved_sparse_encoder

    return saved_sparse_encoder(resolve(spec.source, spec.revision).directory) is not None


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
