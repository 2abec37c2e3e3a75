"""What the library's model classes share: the model loaded on every device it fits, on an event
loop of its own in a background thread, so plain code and notebooks (whose own loop runs) call
it alike, and closed once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from embedx import os_threads
from embedx.config import Settings, load_settings
from embedx.engine import Engine, EngineOptions, open_engine
from embedx.errors import InvalidInput, InvalidOption, ShuttingDown
from embedx.registry import LoadRequest

T = TypeVar("T")
SIGNAL_CHECK_S = 0.1


class LocalModel:
    """A model loaded in this process; subclasses say what it is for (`task`)."""

    task = "embed"

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
        kind = type(self).__name__
        if settings is not None and overrides:
            raise TypeError(
                f"{kind} takes settings= or setting overrides ({', '.join(overrides)}), "
                "not both: dataclasses.replace(settings, ...) combines them"
            )
        if max_seq_len is not None and (type(max_seq_len) is not int or max_seq_len < 1):
            raise InvalidOption(
                f"max_seq_len must be a whole number of tokens, got {max_seq_len!r}",
                param="max_seq_len",
            )
        self.settings = settings or load_settings(overrides)
        self._loop: LoopThread | None = LoopThread(kind)
        try:
            request = LoadRequest(pooling, dtype, max_seq_len, task=self.task)
            self._engine: Engine = self._loop.call(self._load(os.fspath(model), request))
            self._loop.engine = self._engine
        except BaseException:
            self.close()
            raise

    async def _load(self, model: str, request: LoadRequest) -> Engine:
        from embedx.devices import discover
        from embedx.models.catalog import load_catalog
        from embedx.models.source import resolve
        from embedx.registry import Names

        names = Names(self.settings, load_catalog(self.settings.models_file), local_paths=True)
        spec = names.spec_for(model, request)
        self._check_spec(model, spec.pooling is not None, names.look_up, spec)
        files = resolve(spec.source, spec.revision)
        options = EngineOptions.from_settings(self.settings)
        return await open_engine(spec, files, discover(self.settings), options)

    def _check_spec(self, model: str, pooled: bool, look_up: Any, spec: Any) -> None:
        """What a subclass asks of a model before it loads (the Embedder: a pooling)."""

    def _call(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the model's loop and wait for it."""
        return self._loop_for(work).call(self._closing_is_an_error(work))

    def _start(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """`_call` without the wait: `work` started on the model's loop, so that a caller
        keeps several in flight. Cancelling the future cancels the work."""
        return self._loop_for(work)._submit(self._closing_is_an_error(work))

    async def _await(self, work: Coroutine[Any, Any, T]) -> T:
        """`_call` for async code: awaits the work on the model's loop, from any other loop.
        Cancelling it cancels the work (and drops its pending inputs)."""
        loop = self._loop_for(work)
        try:
            return await loop.wrap(self._closing_is_an_error(work))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller's own cancellation
            raise RuntimeError(closed_while_running(type(self).__name__)) from None

    async def _closing_is_an_error(self, work: Coroutine[Any, Any, T]) -> T:
        try:
            return await work
        except ShuttingDown:  # the engine's words are for a server's clients
            raise RuntimeError(closed_while_running(type(self).__name__)) from None

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

    def _loop_for(self, work: Coroutine[Any, Any, Any]) -> LoopThread:
        """The open loop that will run `work`; where there is none, `work` is closed unrun (a
        coroutine never awaited is a warning) and the error raised."""
        try:
            return self._open_loop()
        except RuntimeError:
            work.close()
            raise

    def _open_loop(self) -> LoopThread:
        kind = type(self).__name__
        if self._loop is None:
            raise RuntimeError(closed(kind))
        if self._loop.pid != os.getpid():  # a forked child has no loop thread: it would hang
            article = "an" if kind[0] in "AEIOU" else "a"
            raise RuntimeError(
                f"{article} {kind} does not cross a fork: make one in the child process"
            )
        return self._loop

    def __enter__(self) -> Self:
        self._open_loop()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def closed(kind: str) -> str:
    return f"this {kind} is closed: its model was unloaded; make a new one"


def closed_while_running(kind: str) -> str:
    return f"the {kind} was closed while this call ran"


def check_flag(name: str, flag: object, *, unset_ok: bool = False) -> None:
    """A library caller's flag is a bool ("no" is truthy), or None where that means unset."""
    if not (isinstance(flag, bool) or (flag is None and unset_ok)):
        raise InvalidOption(f"{name} must be True or False, got {flag!r}", param=name)


def check_unicode(texts: Sequence[str]) -> None:
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


class LoopThread:
    """An event loop on a daemon thread, where a library model's engine lives: a script that
    never closes its model still exits (a non-daemon thread would keep it alive)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.pid = os.getpid()
        # The running thread holds this object (its target is a method of it), and so the
        # engine: an Embedder dropped unclosed keeps its model working until the process
        # exits, rather than its engine being collected under its worker tasks.
        self.engine: Engine | None = None
        self._loop = asyncio.new_event_loop()
        self._stopped = False
        self._stopping = threading.Lock()  # no call is scheduled on a loop stopped under it
        name = f"embedx-{kind.lower()}"
        self._thread = os_threads.thread(self._run, name)
        self._thread.start()

    def _run(self) -> None:
        self._loop.run_forever()

    def call(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the loop and wait for it; interrupted (Ctrl-C), it is cancelled."""
        future = self._submit(work)
        try:
            return waited(future)
        except concurrent.futures.CancelledError:  # not by this thread: by `stop`
            raise RuntimeError(closed_while_running(self.kind)) from None
        except BaseException:
            future.cancel()  # a no-op if it already finished (with that exception)
            raise

    def wrap(self, work: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        """`work` run on this loop, as a future of the caller's loop; cancelling that
        cancels the work."""
        return asyncio.wrap_future(self._submit(work))

    def _submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `work` here, unless the loop stopped (another thread closed the model
        after this one found it open): scheduled then, it would never run."""
        with self._stopping:
            if self._stopped:
                work.close()
                raise RuntimeError(
                    f"this {self.kind} is closed: its model was unloaded; make a new one"
                )
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


def waited(future: concurrent.futures.Future[T]) -> T:
    """The future's result, waiting for it in steps: a Ctrl-C (or a SIGTERM the caller raises)
    that the kernel hands to another thread, the tokenizer's say, is raised in this one only
    when it runs again."""
    while not concurrent.futures.wait([future], timeout=SIGNAL_CHECK_S).done:
        pass
    return future.result()
