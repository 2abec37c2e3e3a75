"""A text's tokens as TEI's /tokenize shows them (each id, its text, whether it is special,
and where it lies in the text's UTF-8 bytes), and token ids back to text (/decode): on the
model's tokenizer, whole (neither truncating nor padding), called from a worker thread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from embedx.errors import InputTooLong, InvalidInput

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer


@dataclass(frozen=True, slots=True)
class Token:
    """One token of a text: a special one has its own text and no place in the text."""

    id: int
    text: str
    special: bool
    start: int | None  # in the text's UTF-8 bytes, as TEI counts them
    stop: int | None


class TokenSpans:
    """A model's tokenizer, whole, shared with the windows' (it is never changed once made,
    and encoding only reads it, so threads may call it at once)."""

    def __init__(self, whole: Tokenizer) -> None:
        self._whole = whole
        self.vocab_size = whole.get_vocab_size(with_added_tokens=True)

    def tokens(self, texts: list[str], *, special: bool, max_tokens: int) -> list[list[Token]]:
        """Each text's tokens, none cut; with `special`, the model's special tokens added. More
        than `max_tokens` in all is an InputTooLong error, before any Token is made."""
        encodings = self._whole.encode_batch(texts, add_special_tokens=special)
        count = sum(len(encoding.ids) for encoding in encodings)
        if count > max_tokens:
            raise InputTooLong(
                f"the inputs hold {count} tokens; a request may tokenize {max_tokens} (the "
                "model's length times EMBEDX_MAX_REQUEST_ITEMS): split it",
                param="inputs",
            )
        return [_tokens(text, encoding) for text, encoding in zip(texts, encodings, strict=True)]

    def decode(self, ids: list[list[int]], *, skip_special: bool) -> list[str]:
        """Each list of ids as text; an id outside the vocabulary is an InvalidInput error."""
        for i, row in enumerate(ids):
            if max(row) >= self.vocab_size:
                raise InvalidInput(
                    f"`ids[{i}]` holds {max(row)}, past the model's vocabulary of "
                    f"{self.vocab_size} tokens",
                    param="ids",
                )
        return list(self._whole.decode_batch(ids, skip_special_tokens=skip_special))


def _tokens(text: str, encoding: Encoding) -> list[Token]:
    """The encoding's tokens; the tokenizer's offsets count characters, TEI's count bytes."""
    byte_at = None if text.isascii() else _byte_offsets(text)
    tokens = []
    for id_, (start, stop), special, piece in zip(
        encoding.ids,
        encoding.offsets,
        encoding.special_tokens_mask,
        encoding.tokens,
        strict=True,
    ):
        if special:
            tokens.append(Token(id_, piece, True, None, None))
        elif byte_at is None:
            tokens.append(Token(id_, text[start:stop], False, start, stop))
        else:
            tokens.append(Token(id_, text[start:stop], False, byte_at[start], byte_at[stop]))
    return tokens


def _byte_offsets(text: str) -> list[int]:
    """Where each character starts in the text's UTF-8 bytes, and its length in bytes last."""
    points = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    widths = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
    return [0, *np.cumsum(widths).tolist()]
