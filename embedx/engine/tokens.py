"""TEI's /tokenize and /decode on a model's tokenizer: texts in the prompt the model's
embeddings would get, as all their tokens, and ids back to text, on a worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from embedx.engine.texts import checked_texts
from embedx.errors import InputTooLong

if TYPE_CHECKING:
    from embedx.engine.named import NamedEngine
    from embedx.models.spans import Token


async def tokenize(
    engine: NamedEngine,
    texts: Sequence[str],
    *,
    special: bool = True,
    input_type: str | None = None,
    max_texts: int,
) -> list[list[Token]]:
    """Each text, wrapped in the prompt of `input_type` (or the model's default) as its
    embedding would be, as all its tokens: none cut, as TEI shows them. A text longer than
    the tokenizer ever reads for an embedding is refused, and so are more tokens in all than
    `max_texts` texts of the model's length."""
    texts = engine.prompts.wrap(checked_texts(texts), input_type)
    tokenizer = engine.tokenizer
    bound = tokenizer.windows.read_at_most
    for i, text in enumerate(texts):
        if len(text) > bound:
            raise InputTooLong(
                f"`inputs[{i}]` is {len(text)} characters long (with its prompt); the model's "
                f"tokenizer reads at most {bound} of a text",
                param="inputs",
            )
    max_tokens = max_texts * tokenizer.max_seq_len
    spans = tokenizer.spans
    return await asyncio.to_thread(
        spans.tokens, list(texts), special=special, max_tokens=max_tokens
    )


async def decode(
    engine: NamedEngine, ids: list[list[int]], *, skip_special: bool = True
) -> list[str]:
    """Each list of token ids as the model's tokenizer writes it back."""
    spans = engine.tokenizer.spans
    return await asyncio.to_thread(spans.decode, ids, skip_special=skip_special)
