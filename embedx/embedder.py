"""Embedder: the synchronous facade for scripts and notebooks, over one Engine on its own loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from embedx.config import Settings, load_settings
from embedx.engine import EmbedOptions, Engine, EngineOptions, open_engine
from embedx.errors import InvalidInput, InvalidOption, PoolingRequired, ShuttingDown

T = TypeVar("T")
SIGNAL_CHECK_S = 0.1
CLOSED_WHILE_RUNNING = "the Embedder was closed while this call ran"
CLOSED = "this Embedder is closed: its model was unloaded; make a new one"


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
        if settings is not None and overrides:
            raise TypeError(
                f"Embedder takes settings= or setting overrides ({', '.join(overrides)}), "
                "not both: dataclasses.replace(settings, ...) combines them"
            )
        if max_seq_len is not None and (type(max_seq_len) is not int or max_seq_len < 1):
            raise InvalidOption(
                f"max_seq_len must be a whole number of tokens, got {max_seq_len!r}",
                param="max_seq_len",
            )
        self.settings = settings or load_settings(overrides)
        self._loop: _LoopThread | None = _LoopThread()
        try:
            self._engine: Engine = self._loop.call(
                self._load(os.fspath(model), pooling, dtype, max_seq_len)
            )
            self._loop.engine = self._engine
        except BaseException:
            self.close()
            raise

    async def _load(
        self, model: str, pooling: str | None, dtype: str | None, max_seq_len: int | None
    ) -> Engine:
        from embedx.devices import discover
        from embedx.models.catalog import load_catalog
        from embedx.models.source import resolve
        from embedx.registry import LoadRequest, Names

        names = Names(self.settings, load_catalog(self.settings.models_file), local_paths=True)
        spec = names.spec_for(model, LoadRequest(pooling, dtype, max_seq_len))
        if spec.pooling is None:
            names.look_up(model, spec)  # a wrong name is ModelNotFound, with a hint
            raise PoolingRequired(
                f"say how {model!r} pools: Embedder({model!r}, pooling='mean' | 'cls' | "
                "'last_token'). embedx never guesses pooling",
                param="pooling",
            )
        files = resolve(spec.source, spec.revision)
        options = EngineOptions.from_settings(self.settings)
        return await open_engine(spec, files, discover(self.settings), options)

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
        """(N, D) float32 vectors in the order of `texts` (a single string gives (1, D)).
        Interrupting it (Ctrl-C) drops the texts it has not embedded yet."""
        loop = self._open_loop()
        return loop.call(self._embed(texts, dimensions, normalize, input_type, truncate))

    async def aembed(
        self,
        texts: Sequence[str] | str,
        *,
        dimensions: int | None = None,
        normalize: bool | None = None,
        input_type: str | None = None,
        truncate: bool = True,
    ) -> np.ndarray:
        """`embed` for async code: awaits the engine on its own loop, from any other loop.
        Cancelling it drops the texts it has not embedded yet."""
        loop = self._open_loop()
        try:
            return await loop.wrap(self._embed(texts, dimensions, normalize, input_type, truncate))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller's own cancellation
            raise RuntimeError(CLOSED_WHILE_RUNNING) from None

    async def _embed(
        self,
        texts: Sequence[str] | str,
        dimensions: int | None,
        normalize: bool | None,
        input_type: str | None,
        truncate: bool,
    ) -> np.ndarray:
        batch = [texts] if isinstance(texts, str) else texts
        if isinstance(batch, Sequence):  # else the engine says what texts must be
            _check_unicode(batch)
        for name, flag, unset_ok in (("normalize", normalize, True), ("truncate", truncate, False)):
            if not (isinstance(flag, bool) or (flag is None and unset_ok)):  # "no" is truthy
                raise InvalidOption(f"{name} must be True or False, got {flag!r}", param=name)
        options = EmbedOptions(dimensions, normalize, truncate, input_type)
        try:
            return (await self._engine.embed(batch, options)).vectors
        except ShuttingDown:  # the engine's words are for a server's clients
            raise RuntimeError(CLOSED_WHILE_RUNNING) from None

    def close(self) -> None:
        """Unload the model and stop the background loop. Safe to call twice."""
        loop, self._loop = self._loop, None
        if loop is None or loop.pid != os.getpid():  # closed, or a forked child's copy
            return
        engine: Engine | None = getattr(self, "_engine", None)
        try:
            if engine is not None:
                loop.call(engine.close())
        finally:
            loop.stop()

    def _open_loop(self) -> _LoopThread:
        if self._loop is None:
            raise RuntimeError(CLOSED)
        if self._loop.pid != os.getpid():  # a forked child has no loop thread: it would hang
            raise RuntimeError("an Embedder does not cross a fork: make one in the child process")
        return self._loop

    def __enter__(self) -> Embedder:
        self._open_loop()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _check_unicode(texts: Sequence[str]) -> None:
    """A lone surrogate (undecodable bytes read with `surrogateescape`, say) fails the
    tokenizer with a TypeError naming no text. The server's JSON never holds one."""
    for index, text in enumerate(texts):
        if isinstance(text, str) and not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidInput(
                    f"input[{index}] is not valid Unicode: {exc.reason} at character "
                    f"{exc.start} (bytes that were not UTF-8?)",
                    param="input",
                ) from None


class _LoopThread:
    """An event loop on a daemon thread, where an Embedder's engine lives: a script that
    never closes its Embedder still exits (a non-daemon thread would keep it alive)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        # The running thread holds this object (its target is a method of it), and so the
        # engine: an Embedder dropped unclosed keeps its model working until the process
        # exits, rather than its engine being collected under its worker tasks.
        self.engine: Engine | None = None
        self._loop = asyncio.new_event_loop()
        self._stopped = False
        self._stopping = threading.Lock()  # no call is scheduled on a loop stopped under it
        self._thread = threading.Thread(target=self._run, name="embedx-embedder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._loop.run_forever()

    def call(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the loop and wait for it; interrupted (Ctrl-C), it is cancelled."""
        future = self._submit(work)
        try:
            # Waking now and then: a Ctrl-C that the kernel hands to another thread (the
            # tokenizer's, say) is raised here only when this thread runs again.
            while not concurrent.futures.wait([future], timeout=SIGNAL_CHECK_S).done:
                pass
            return future.result()
        except concurrent.futures.CancelledError:  # not by this thread: by `stop`
            raise RuntimeError(CLOSED_WHILE_RUNNING) from None
        except BaseException:
            future.cancel()  # a no-op if it already finished (with that exception)
            raise

    def wrap(self, work: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        """`work` run on this loop, as a future of the caller's loop; cancelling that
        cancels the work."""
        return asyncio.wrap_future(self._submit(work))

    def _submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `work` here, unless the loop stopped (another thread closed the Embedder
        after this one found it open): scheduled then, it would never run."""
        with self._stopping:
            if self._stopped:
                work.close()
                raise RuntimeError(CLOSED)
            return asyncio.run_coroutine_threadsafe(work, self._loop)

    def stop(self) -> None:
        """Cancel what still runs here (calls from other threads, a tokenizer's wait), so
        that none of their callers waits for ever, then stop the loop and its thread."""

        async def cancel_the_rest() -> None:
            rest = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        with self._stopping:  # what was scheduled before runs first, and is cancelled
            self._stopped = True
        asyncio.run_coroutine_threadsafe(cancel_the_rest(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
