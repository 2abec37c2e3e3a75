"""How a request's texts are cut into tokenizer calls: where each chunk ends, and which
requests are small enough to tokenize on the event loop itself."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embedx.models.tokenizer import Input

# Texts a request submits at a time: a small first chunk so the devices start early, then
# larger ones. The tokenizer spreads each call over every core, so calls run one at a time,
# and chunks of concurrent requests that arrive meanwhile share the next
# (on 2 cores, as fast as one call over all the texts with their ids collected).
FIRST_CHUNK = 1024
CHUNK = 4096
# Characters a request's first chunk holds at most, each next chunk twice the last's: a
# request of a few long texts starts on the devices too while the rest is tokenized. One
# rerank query of 100 passages (61k characters) took 9.7 ms to tokenize before its one
# batch began, which then ran 15.2 ms on an H100; cut so, its p50 did not move there (28.1
# against 27.2 ms, two batches for one), but it helped on two cores (bench/results/rerank.md).
FIRST_CHARS = 16384
# A request of at most this many characters (a query or two) finding the tokenizer's thread
# idle is tokenized on the loop: less than two thread wake-ups. 8-text requests tokenized
# there ran 25 to 50% slower at 16 and 64 clients (H100, bench/online.py): the thread has them.
INLINE_CHARS = 512


def characters(item: Input) -> int:
    """A text's characters, or a pair's two sides'."""
    return len(item) if isinstance(item, str) else len(item[0]) + len(item[1])


def fits_inline(inputs: Sequence[Input]) -> bool:
    """Whether the inputs have at most INLINE_CHARS characters (counted until they pass it)."""
    total = 0
    for item in inputs:
        total += characters(item)
        if total > INLINE_CHARS:
            return False
    return True


def chunk_bounds(sizes: Iterable[int]) -> Iterator[tuple[int, int]]:
    """[start, stop) of each tokenizer call for texts of these sizes (characters), each as
    it is reached: at most FIRST_CHUNK texts and FIRST_CHARS characters, then CHUNK texts and
    twice the characters of the chunk before; one text at least. No texts: one empty call."""
    start = stop = held = 0
    most_texts, most_characters = FIRST_CHUNK, FIRST_CHARS
    for size in sizes:
        if stop > start and (stop - start == most_texts or held + size > most_characters):
            yield start, stop
            start, held = stop, 0
            most_texts, most_characters = CHUNK, 2 * most_characters
        held += size
        stop += 1
    yield start, stop
