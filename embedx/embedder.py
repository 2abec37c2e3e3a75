"""Embedder: the synchronous facade for scripts and notebooks, over one Engine on its own loop."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np

from embedx.config import Settings, load_settings
from embedx.engine import EmbedOptions, Engine
from embedx.errors import PoolingRequired


class Embedder:
    """Embed texts with one model on every device it fits, from plain (non-async) code.

        with Embedder("sentence-transformers/all-MiniLM-L6-v2", pooling="mean") as e:
            vectors = e.embed(["first text", "second text"])  # (2, 384) float32

    The engine runs on an event loop in a background thread, so this also works inside a
    notebook whose own loop is running.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        pooling: str | None = None,
        dtype: str | None = None,
        max_seq_len: int | None = None,
        settings: Settings | None = None,
        **overrides: Any,
    ) -> None:
        from anyio.from_thread import start_blocking_portal

        self.settings = settings or load_settings(overrides)
        self._portal_context: contextlib.AbstractContextManager[Any] | None = (
            start_blocking_portal()
        )
        self._portal = self._portal_context.__enter__()
        try:
            self._engine: Engine = self._portal.call(
                self._load, os.fspath(model), pooling, dtype, max_seq_len
            )
        except BaseException:
            self.close()
            raise

    async def _load(
        self, model: str, pooling: str | None, dtype: str | None, max_seq_len: int | None
    ) -> Engine:
        from embedx.devices import discover, open_accelerator
        from embedx.models.catalog import load_catalog
        from embedx.models.source import check_exists, resolve
        from embedx.registry import LoadRequest, ModelRegistry

        devices = discover(self.settings)
        registry = ModelRegistry(
            self.settings, load_catalog(self.settings.models_file), devices, open_accelerator
        )
        spec = registry.spec_for(model, LoadRequest(pooling, dtype, max_seq_len))
        if spec.pooling is None:
            check_exists(spec.source, spec.revision)  # a wrong name is ModelNotFound
            raise PoolingRequired(
                f"say how {model!r} pools: Embedder({model!r}, pooling='mean' | 'cls' | "
                "'last_token'). embedx never guesses pooling",
                param="pooling",
            )
        files = resolve(spec.source, spec.revision)
        accelerators = [open_accelerator(info) for info in devices]
        return await Engine.load(spec, files, accelerators, registry.engine_options())

    @property
    def engine(self) -> Engine:
        return self._engine

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
    ) -> np.ndarray:
        """(N, D) float32 vectors in the order of `texts` (a single string gives (1, D))."""
        self._check_open()
        batch = [texts] if isinstance(texts, str) else texts
        options = EmbedOptions(dimensions, normalize, truncate, input_type)
        result = self._portal.call(self._engine.embed, batch, options)
        return result.vectors

    def close(self) -> None:
        """Unload the model and stop the background loop. Safe to call twice."""
        context, self._portal_context = self._portal_context, None
        if context is None:
            return
        engine: Engine | None = getattr(self, "_engine", None)
        try:
            if engine is not None:
                self._portal.call(engine.close)
        finally:
            context.__exit__(None, None, None)

    def _check_open(self) -> None:
        if self._portal_context is None:
            raise RuntimeError("this Embedder is closed: its model was unloaded; make a new one")

    def __enter__(self) -> Embedder:
        self._check_open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
