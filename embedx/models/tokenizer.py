"""Texts to token ids with the model's fast tokenizer: templates, truncation (counted), and
batch encoding that runs off the event loop in Rust threads."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from typing import TYPE_CHECKING

import numpy as np

from embedx.batching import gc_paused
from embedx.errors import InputTooLong, InvalidInput

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

    from embedx.models.source import ModelFiles


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


class TextTokenizer:
    """The model's fast tokenizer, set to add special tokens and truncate to `max_seq_len`."""

    def __init__(self, files: ModelFiles, max_seq_len: int) -> None:
        self.max_seq_len = max_seq_len
        self._tokenizer = _load(files)
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_seq_len)
        # tokenizers >= 0.22 encodes in its own threads behind an awaitable
        self._async = hasattr(self._tokenizer, "async_encode_batch_fast")

    async def encode(self, texts: Sequence[str], *, truncate: bool = True) -> Encoded:
        """Encode without blocking the event loop; with `truncate` off, an over-long text is
        an InputTooLong error naming it."""
        if self._async:
            encodings = await self._tokenizer.async_encode_batch_fast(list(texts))
        else:
            encodings = await asyncio.to_thread(self._tokenizer.encode_batch_fast, list(texts))
        return self._collect(encodings, truncate)

    def encode_now(self, texts: Sequence[str], *, truncate: bool = True) -> Encoded:
        """Blocking encode, for load-time probes and tools."""
        return self._collect(self._tokenizer.encode_batch_fast(list(texts)), truncate)

    def _collect(self, encodings: list[Encoding], truncate: bool) -> Encoded:
        with gc_paused():
            return self._gather(encodings, truncate)

    def _gather(self, encodings: list[Encoding], truncate: bool) -> Encoded:
        # One int32 array per chunk: the ids' Python ints live only while they are copied,
        # so tens of thousands of texts leave no garbage for the collector to scan.
        lengths = list(map(len, encodings))
        total = sum(lengths)
        ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.int32, total)
        truncated = [i for i, e in enumerate(encodings) if e.overflowing]
        if truncated and not truncate:
            raise InputTooLong(
                f"input {truncated[0]} is longer than this model's {self.max_seq_len} tokens; "
                "send shorter texts or set truncate to true",
                param="inputs",
            )
        if 0 in lengths:
            raise InvalidInput(
                f"input {lengths.index(0)} has no tokens for this model's tokenizer",
                param="input",
            )
        offsets = [0, *accumulate(lengths)][:-1]
        return Encoded(ids, offsets, lengths, len(truncated))


def _load(files: ModelFiles) -> Tokenizer:
    from tokenizers import Tokenizer

    path = files.directory / "tokenizer.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    # Only slow-tokenizer files (vocab.txt, sentencepiece): transformers converts them.
    from transformers import AutoTokenizer

    converted = AutoTokenizer.from_pretrained(str(files.directory), use_fast=True)
    backend: Tokenizer = converted.backend_tokenizer
    return backend
