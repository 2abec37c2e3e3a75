"""Pairs tokenized in one call, as the engine's tokenizer does chunk by chunk, for the tests of
the pair encoding and the scoring heads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from embedx.models.pairs import pair_encodings, typed_ids


@dataclass(frozen=True, slots=True)
class EncodedPairs:
    ids: np.ndarray  # every pair's ids end to end, with their types where asked
    lengths: list[int]
    truncated: list[int]  # the pairs cut to fit, by index

    def views(self) -> list[np.ndarray]:
        offsets = np.cumsum([0, *self.lengths[:-1]]).tolist()
        return [self.ids[o : o + n] for o, n in zip(offsets, self.lengths, strict=True)]


def encode_pairs(
    tokenizer: Any,
    pairs: Sequence[tuple[str, str]],
    max_len: int,
    *,
    types: bool,
    cut: Callable[[str], str] | None = None,
) -> EncodedPairs:
    encodings, truncated = pair_encodings(tokenizer, pairs, max_len, cut=cut)
    lengths = [len(e) for e in encodings]
    ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.int32, sum(lengths))
    return EncodedPairs(typed_ids(ids, encodings) if types else ids, lengths, truncated)
