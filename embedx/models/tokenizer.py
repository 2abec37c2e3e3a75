"""Texts, or (query, document) pairs, to token ids with the model's fast tokenizer: truncation
(counted), texts far longer than the model reads tokenized from a window of their start
(windows.py), and batch encoding off the event loop (but for small requests) on a thread of its
own, one call at a time, shared (up to CALL_TEXTS inputs) by the requests that queue inputs
while it runs; a second thread takes the ids out of each call while the next runs."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from typing import TYPE_CHECKING, cast

import numpy as np

from embedx import os_threads
from embedx.errors import InputTooLong, InvalidInput, InvalidModel, ShuttingDown
from embedx.models.chunks import characters, chunk_bounds, fits_inline
from embedx.models.pairs import pair_encodings, typed_ids
from embedx.models.spans import TokenSpans
from embedx.models.windows import Windows

log = logging.getLogger("embedx.tokenizer")

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

    from embedx.models.source import ModelFiles

# Chunks a request keeps queued beyond the one it handles: with two, the tokenizer encodes
# one while the collecting thread takes the ids out of the other, even for a lone request.
CHUNKS_AHEAD = 2
# Texts a tokenizer call takes at most, in whole waiters (at least one). Requests that arrive
# together are encoded over several calls, so the devices start on the first call's texts
# while the next encodes and the requests finish one call at a time: one call for all of
# them made each stage wait for the one before, in step (64 callers of 256 texts on an H200:
# a request's call took 194 ms to encode, median, and the tokenizer waited for texts 41% of
# the time; bench/load.py).
CALL_TEXTS = 2048
# Where a model without tokenizer.json keeps its vocabulary (transformers converts these).
SLOW_TOKENIZER_FILES = ("vocab.txt", "vocab.json", "*.model")


@dataclass(frozen=True, slots=True)
class Encoded:
    """A chunk of texts as token ids, in order, after truncation: text i is
    `ids[offsets[i] : offsets[i] + lengths[i]]`."""

    ids: np.ndarray  # (total,) int32, every text's ids end to end
    offsets: list[int]
    lengths: list[int]
    truncated: int  # how many texts were cut to the model's length

    def views(self) -> list[np.ndarray]:
        """Each text's ids as a view into the chunk's one array."""
        ids = self.ids
        return [ids[o : o + n] for o, n in zip(self.offsets, self.lengths, strict=True)]


Input = str | tuple[str, str]  # a text, or a (query, document) pair


class TextTokenizer:
    """The model's fast tokenizer, set to add special tokens and truncate to `max_seq_len`:
    texts, or with `pairs` (query, document) pairs, each token's type in its id's high bits
    where `token_types` (pairs.py)."""

    def __init__(
        self,
        files: ModelFiles,
        max_seq_len: int,
        *,
        pairs: bool = False,
        token_types: bool = False,
    ) -> None:
        self.max_seq_len = max_seq_len
        self.pairs = pairs
        self.token_types = token_types
        self._tokenizer = _load(files)
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_seq_len)
        whole = _load(files)
        _start_workers(whole)
        self.windows = Windows(whole, self._tokenizer, max_seq_len)
        self.spans = TokenSpans(whole)  # TEI's /tokenize and /decode, on the windows' copy
        # One thread makes the calls, back to back: the next starts as the last returns,
        # with whatever texts were queued meanwhile, not when the busy event loop gets to
        # the last one's result (on an H200 the server's loop thread spent about 10%
        # less time a text, its requests 30 to 50% less waiting for their tokens:
        # bench/load.py).
        # The tokenizer spreads each call over every core itself.
        self._queued = threading.Condition()
        self._waiting: collections.deque[_Waiter] = collections.deque()
        self._closed = False
        self._thread: threading.Thread | None = None
        # For /info: when tokenizing limits a server, its busy share nears 1.
        self.calls = 0
        self.texts = 0
        self.busy_s = 0.0
        self.collect_s = 0.0  # the collecting thread's, taking ids out (it too can limit)
        # The tokenizer's thread between calls: waiting for texts, and freeing the last
        # call's encodings. A thread that seldom waits for texts is what limits, whatever
        # share of its time the calls take (the rest goes on the interpreter lock).
        self.idle_s = 0.0
        self._idle_since: float | None = None  # when the wait in progress began
        self.free_s = 0.0

    async def encode_chunks(
        self, texts: Sequence[Input], *, truncate: bool = True
    ) -> AsyncGenerator[tuple[int, Encoded]]:
        """Encode in chunks without blocking the event loop, yielding (first index, chunk) in
        order; the next chunks encode on the tokenizer's threads while the caller handles
        this one. With `truncate` off, an over-long text is an InputTooLong error naming it."""
        if self._idle() and fits_inline(texts):
            yield 0, self.encode_now(texts, truncate=truncate)
            return
        # each chunk's bounds as it is queued: a million texts are measured a chunk at a time
        following = chunk_bounds(map(characters, texts))
        ahead: collections.deque[tuple[int, asyncio.Future[Encoded]]] = collections.deque()

        def queue_more(most: int) -> None:
            for first, stop in itertools.islice(following, most - len(ahead)):
                queued = self._start(texts[first:stop], truncate=truncate, offset=first)
                ahead.append((first, queued))

        queue_more(1)
        try:
            while ahead:
                start, chunk = ahead[0]
                encoded = await chunk
                ahead.popleft()
                queue_more(CHUNKS_AHEAD)
                yield start, encoded
        finally:
            for _, future in ahead:
                future.cancel()  # the caller stopped early: its texts leave the next call

    def _idle(self) -> bool:
        """Whether the tokenizer's thread waits for texts (or has not started); racy, harmless."""
        return not self._waiting and (self._thread is None or self._idle_since is not None)

    def idle_seconds(self) -> float:
        """`idle_s` with the wait in progress: an idle server's thread is waiting now."""
        since = self._idle_since
        return self.idle_s + (time.monotonic() - since if since is not None else 0.0)

    def _start(
        self, texts: Sequence[Input], *, truncate: bool, offset: int
    ) -> asyncio.Future[Encoded]:
        """Queue texts for the tokenizer's thread: they go in its next call, together with
        whatever else arrives until it starts. `offset`: the first text's index in its
        request, for error messages."""
        future: asyncio.Future[Encoded] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(texts, truncate, offset, future)
        with self._queued:
            if self._closed:
                raise ShuttingDown("the model is closing: its tokenizer takes no more texts")
            self._waiting.append(waiter)
            if self._thread is None:
                self._thread = os_threads.thread(self._run, "embedx-tokenizer")
                self._thread.start()
            self._queued.notify()
        return future

    def _run(self) -> None:
        """The tokenizer's thread: one call at a time over everything queued, each call's
        chunks made on the collecting thread while the next call runs; once closed, whoever
        still waits hears so.

        The encodings the collector is done with are freed here, before the next call: their
        Rust strings were allocated by the tokenizer's worker threads, and freeing them while
        those threads allocate the next call's contends for the allocator's locks, all with
        the interpreter lock held. (An idle tokenizer keeps its last call's until the next.)"""
        calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        spent: queue.SimpleQueue[list[Encoding]] = queue.SimpleQueue()
        collector = os_threads.thread(self._collect, "embedx-token-ids", calls, spent)
        collector.start()
        try:
            while True:
                with self._queued:
                    while not self._waiting and not self._closed:
                        self._idle_since = waiting = time.monotonic()
                        self._queued.wait()
                        self._idle_since = None  # before the sum: a reader never counts twice
                        self.idle_s += time.monotonic() - waiting
                    if self._closed:
                        closing = ShuttingDown("the model closed while its texts were queued")
                        for waiter in self._waiting:
                            _hand(waiter, closing)
                        return
                    batch = self._next_call()
                freeing = time.monotonic()
                while not spent.empty():
                    spent.get()  # and freed
                self.free_s += time.monotonic() - freeing
                if batch:
                    self._call(batch, calls)
                del batch  # and its texts: an idle thread holds none (one may be 30 MB)
        except BaseException as exc:  # a bug: whoever waits hears it; the next text restarts
            with self._queued:
                self._thread = None
                for waiter in self._waiting:
                    _hand(waiter, exc)
                self._waiting.clear()
            log.error("the tokenizer's thread failed", exc_info=exc)
        finally:
            calls.put(None)  # the collector hands out what it holds, then ends
            collector.join()

    def _call(self, batch: list[_Waiter], calls: queue.SimpleQueue[_Call | None]) -> None:
        """One tokenizer call over the waiters' texts, for the collector."""
        try:
            texts = [text for waiter in batch for text in waiter.texts]
            calls.put(_Call(batch, *self._encode(texts)))
        except BaseException as exc:  # a Rust panic is no Exception
            for waiter in batch:
                _hand(waiter, exc)

    def _next_call(self) -> list[_Waiter]:
        """The waiters for the next call, in arrival order: whole ones up to CALL_TEXTS texts,
        at least one. A caller that stopped waiting leaves the queue (racy, harmless)."""
        batch: list[_Waiter] = []
        texts = 0
        waiting = self._waiting
        while waiting and (not batch or texts + len(waiting[0].texts) <= CALL_TEXTS):
            waiter = waiting.popleft()
            if not waiter.future.done():
                batch.append(waiter)
                texts += len(waiter.texts)
        return batch

    def _collect(
        self, calls: queue.SimpleQueue[_Call | None], spent: queue.SimpleQueue[list[Encoding]]
    ) -> None:
        """The collecting thread: each waiter's ids out of its call's encodings into one array,
        handed to the waiter; the encodings then go back to be freed (see `_run`)."""
        while (call := calls.get()) is not None:
            self._hand_out(call)
            spent.put(call.encodings)
            del call  # and its texts, as the waiters' (`_hand_out`'s locals went with it)

    def _hand_out(self, call: _Call) -> None:
        """Each of a call's waiters its chunk, or its error."""
        start = 0
        clock = time.monotonic()
        for waiter in call.waiters:
            stop = start + len(waiter.texts)
            try:
                unread = [i - start for i in call.unread if start <= i < stop]
                result: Encoded | BaseException = self._gather(
                    call.encodings[start:stop], waiter.truncate, waiter.offset, unread
                )
            except BaseException as exc:  # this waiter's alone: a text too long, or no tokens
                result = exc
            now = time.monotonic()
            self.collect_s += now - clock  # counted before its waiter hears
            clock = now
            _hand(waiter, result)
            start = stop

    def _encode(self, inputs: list[Input]) -> tuple[list[Encoding], list[int]]:
        """The inputs' encodings, truncated, and which of them were truncated before the
        tokenizer's own truncation could tell: texts read only up to `read_at_most`
        characters (windows.py), pairs cut to fit."""
        started = time.monotonic()
        try:  # the tokenizer releases the GIL while it encodes
            if self.pairs:
                return self._encode_scored(inputs)
            return self._encode_texts(cast("list[str]", inputs))
        finally:
            with self._queued:
                self.busy_s += time.monotonic() - started
                self.calls += 1
                self.texts += len(inputs)

    def _encode_texts(self, texts: list[str]) -> tuple[list[Encoding], list[int]]:
        """Texts, those longer than `cut_at` characters from a window of their start."""
        limit = self.windows.cut_at
        long = [i for i, text in enumerate(texts) if len(text) > limit]
        if not long:
            return self._tokenizer.encode_batch_fast(texts), []
        encodings = self._tokenizer.encode_batch_fast(
            [text if len(text) <= limit else "" for text in texts]
        )
        windowed, at_bound = self.windows.windowed([texts[i] for i in long])
        for i, encoding in zip(long, windowed, strict=True):
            encodings[i] = encoding
        return encodings, [long[k] for k in at_bound]

    def _encode_scored(self, inputs: list[Input]) -> tuple[list[Encoding], list[int]]:
        """A scorer's inputs: (query, document) pairs as CrossEncoder pairs them, and single
        texts (a classifier's, or a model scoring one text) as texts."""
        at = [i for i, item in enumerate(inputs) if isinstance(item, tuple)]
        pairs = [cast("tuple[str, str]", inputs[i]) for i in at]
        cut = self.windows.prefix
        encodings, truncated = pair_encodings(self._tokenizer, pairs, self.max_seq_len, cut=cut)
        if len(at) == len(inputs):
            return encodings, truncated
        alone = [i for i, item in enumerate(inputs) if not isinstance(item, tuple)]
        text_encodings, unread = self._encode_texts([cast("str", inputs[i]) for i in alone])
        merged: list[Encoding | None] = [None] * len(inputs)
        for i, encoding in zip(at, encodings, strict=True):
            merged[i] = encoding
        for i, encoding in zip(alone, text_encodings, strict=True):
            merged[i] = encoding
        cut_short = sorted([at[k] for k in truncated] + [alone[k] for k in unread])
        return cast("list[Encoding]", merged), cut_short

    def close(self) -> None:
        """Stop the tokenizer's threads once the call in progress, if any, is handed out."""
        with self._queued:
            self._closed = True
            self._queued.notify()

    def encode_now(self, inputs: Sequence[Input], *, truncate: bool = True) -> Encoded:
        """Blocking encode: small requests' on the loop (`encode_chunks`), tests', bench/'s."""
        encodings, unread = self._encode(list(inputs))
        return self._gather(encodings, truncate, 0, unread)

    def _gather(
        self,
        encodings: list[Encoding],
        truncate: bool,
        offset: int,
        unread: Sequence[int] = (),
    ) -> Encoded:
        """The chunk of these encodings; `unread`: those of texts read only in part."""
        # One int32 array per chunk: the ids' Python ints live only while they are copied,
        # so tens of thousands of texts leave no garbage for the collector to scan.
        lengths = list(map(len, encodings))
        total = sum(lengths)
        ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.int32, total)
        if self.token_types:
            ids = typed_ids(ids, encodings)
        # Only a text cut to the full length can have been cut: ask just those (asking every
        # encoding builds a Python list for each).
        full = self.max_seq_len
        truncated = [i for i, n in enumerate(lengths) if n == full and encodings[i].overflowing]
        if unread:
            truncated = sorted({*truncated, *unread})
        if truncated and not truncate:
            i = truncated[0]
            longer = (
                f"{self.windows.read_at_most} characters, the most this model reads"
                if i in unread and not self.pairs
                else f"this model's {self.max_seq_len} tokens"
            )
            raise InputTooLong(
                f"input {offset + i} is longer than {longer}; send shorter texts or set "
                "truncate to true",
                param="inputs",
            )
        if 0 in lengths:
            raise InvalidInput(
                f"input {offset + lengths.index(0)} has no tokens for this model's tokenizer",
                param="input",
            )
        offsets = [0, *accumulate(lengths)][:-1]
        return Encoded(ids, offsets, lengths, len(truncated))


@dataclass(frozen=True, slots=True)
class _Call:
    """A tokenizer call's encodings, for its waiters in order."""

    waiters: list[_Waiter]
    encodings: list[Encoding]
    unread: list[int]  # inputs truncated before the tokenizer's truncation (`_encode`)


@dataclass(slots=True)
class _Waiter:
    """A caller's texts queued for the tokenizer's thread, and the future for their chunk."""

    texts: Sequence[Input]
    truncate: bool
    offset: int
    future: asyncio.Future[Encoded]


def _hand(waiter: _Waiter, result: Encoded | BaseException) -> None:
    """From the tokenizer's thread: settle a waiter's future on its own loop."""
    with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
        waiter.future.get_loop().call_soon_threadsafe(_settle, waiter.future, result)


def _settle(future: asyncio.Future[Encoded], result: Encoded | BaseException) -> None:
    """On the waiter's loop: give it its chunk, unless it stopped waiting."""
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


_workers_started = False


def _start_workers(tokenizer: Tokenizer) -> None:
    """Start the tokenizer library's worker pool, once a process, from a thread named for it.
    Its first parallel call makes the pool, and each worker takes its maker's OS name: made
    by a small request tokenized on the event loop, they would show in `top -H` under the
    loop's name, their work mistaken for the loop's."""
    global _workers_started
    if _workers_started:
        return
    _workers_started = True
    starter = os_threads.thread(tokenizer.encode_batch, "embedx-tokenizer", ["a", "b"])
    starter.start()
    starter.join()


def _load(files: ModelFiles) -> Tokenizer:
    from tokenizers import Tokenizer

    path = files.directory / "tokenizer.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    if not any(any(files.directory.glob(name)) for name in SLOW_TOKENIZER_FILES):
        # transformers would make a tokenizer with no vocabulary: every word [UNK]
        raise InvalidModel(f"{files.origin} has no tokenizer: no tokenizer.json, vocab.txt, "
                           "vocab.json or sentencepiece model", param="model")  # fmt: skip
    # Only slow-tokenizer files (vocab.txt, sentencepiece): transformers converts them.
    from transformers import AutoTokenizer

    # trust_remote_code: never the checkpoint's own Python (its `auto_map`), never a prompt
    converted = AutoTokenizer.from_pretrained(
        str(files.directory), use_fast=True, trust_remote_code=False
    )
    backend: Tokenizer = converted.backend_tokenizer
    return backend
