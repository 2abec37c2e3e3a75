"""(query, document) pairs to token ids as sentence-transformers' CrossEncoder tokenizes them, each
token's type carried in its id's high bits, and split again on the device.

CrossEncoder calls the model's tokenizer on (queries, documents) with truncation
"longest_first" to the tokenizer's model_max_length (`pair_max_length`), on the right: tokens
come off the longer side until both fit, then off both in turn. The fast tokenizer's pair
template adds the special tokens and gives the document's tokens type 1 where the model has
types (BERT: [CLS] q [SEP] d [SEP]; XLM-R: <s> q </s></s> d </s>, all type 0).

A work record carries one int32 array of ids per item, so a pair's token types ride in the
same array: id | type << TYPE_SHIFT. A model that reads types (`reads_token_types`) splits
them on the device (`split_types`); one that does not gets bare ids. Token ids must stay below
2**24 and types below 2**7 (the sign bit).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embedx.errors import InvalidModel
from embedx.models.task import read_json, saved_cross_encoder

if TYPE_CHECKING:
    import torch
    from tokenizers import Encoding, Tokenizer

TYPE_SHIFT = 24
ID_MASK = (1 << TYPE_SHIFT) - 1
TYPE_LIMIT = 1 << (31 - TYPE_SHIFT)  # types at or above it would set the sign bit
# transformers' "no limit" for a tokenizer's model_max_length
UNLIMITED = int(1e30)
# the config files sentence-transformers' Transformer module reads, in its order
ST_MODULE_CONFIGS = ("sentence_bert_config.json", "sentence_roberta_config.json",
                     "sentence_distilbert_config.json", "sentence_camembert_config.json",
                     "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
                     "sentence_xlnet_config.json")  # fmt: skip


def pair_encodings(
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    max_len: int,
    *,
    cut: Callable[[str], str] | None = None,
) -> tuple[list[Encoding], list[int]]:
    """Pairs tokenized as CrossEncoder tokenizes them, to at most `max_len` tokens each; and
    which of them were truncated.

    Each side is encoded alone, then shortened so that the tokenizer's own pair truncation
    (`Tokenizer.post_process`) sees the same as it would with the whole sides (`_kept`), and
    adds the special tokens. Encoding the pair at once would also build every combination of
    the two sides' overflowing pieces: their product, 4,000 encodings for two sides of 4,000
    tokens truncated to 128.

    `cut` shortens a side before it is tokenized, so that a huge document costs what the model
    reads of it. The tokens kept are the same provided a cut side keeps at least `max_len`
    tokens (the cut's to ensure) and which side is longer stays known: a cut side counts as
    longer than a whole one, and of two cut sides the one of more characters. Only there can
    the result differ from CrossEncoder's (which tokenizes both sides whole), by the one token
    that an odd budget gives the longer side.

    Leaves the tokenizer truncating to `max_len` (longest first, right) with padding off: give
    it a tokenizer of its own (this model's pairs), one call at a time."""
    if tokenizer.padding is not None:
        tokenizer.no_padding()
    # Each distinct text is encoded once: a rerank request pairs one query with every document
    # (100 documents: 101 texts, not 200; 5 to 10% less time on two cores).
    texts = list(dict.fromkeys(text for pair in pairs for text in pair))
    index = {text: i for i, text in enumerate(texts)}
    kept = texts if cut is None else [cut(text) for text in texts]
    tokenizer.no_truncation()
    try:
        sides = tokenizer.encode_batch_fast(kept, add_special_tokens=False)
    finally:  # set again even on failure: the next call's texts must not go untruncated
        tokenizer.enable_truncation(max_len, strategy="longest_first", direction="right")
    budget = max_len - tokenizer.num_special_tokens_to_add(True)
    encodings = []
    truncated = []
    for i, (query_text, document_text) in enumerate(pairs):
        q, d = index[query_text], index[document_text]
        n_query, n_document = len(sides[q]), len(sides[d])
        order = _order(n_query, n_document, texts[q], texts[d], kept[q], kept[d])
        query = _truncated(sides[q], _kept(n_query, n_document, order, budget))
        document = _truncated(sides[d], _kept(n_document, n_query, -order, budget))
        was_cut = len(kept[q]) < len(texts[q]) or len(kept[d]) < len(texts[d])
        if was_cut or n_query + n_document > budget:
            truncated.append(i)
        encodings.append(tokenizer.post_process(query, document, add_special_tokens=True))
    return encodings, truncated


def _truncated(side: Encoding, keep: int) -> Encoding:
    """A side cut to `keep` tokens: a copy, as other pairs may share its encoding."""
    if keep >= len(side):
        return side
    cut = copy.copy(side)
    cut.truncate(keep)
    return cut


def typed_ids(ids: np.ndarray, encodings: Sequence[Encoding]) -> np.ndarray:
    """`ids` (the encodings' ids end to end) with each token's type in its high bits."""
    total = len(ids)
    kinds = np.fromiter(chain.from_iterable(e.type_ids for e in encodings), np.int32, total)
    if total and (int(ids.max()) > ID_MASK or int(kinds.max()) >= TYPE_LIMIT):
        raise InvalidModel(
            f"token ids up to {int(ids.max())} and types up to {int(kinds.max())} do not "
            f"fit one int32 (ids below 2**{TYPE_SHIFT}, types below {TYPE_LIMIT})"
        )
    ids |= kinds << TYPE_SHIFT
    return ids


def _order(
    n_query: int, n_document: int, query: str, document: str, kept_query: str, kept_document: str
) -> int:
    """Which side has more tokens whole: 1 the query, -1 the document, 0 neither. A cut side
    (kept shorter than it is) counts as longer than a whole one; of two cut sides, the one of
    more characters is."""
    cut_query, cut_document = len(kept_query) < len(query), len(kept_document) < len(document)
    if cut_query != cut_document:
        return 1 if cut_query else -1
    if cut_query and len(query) != len(document):
        return 1 if len(query) > len(document) else -1
    return (n_query > n_document) - (n_query < n_document)


def _kept(n: int, other: int, order: int, budget: int) -> int:
    """How many of a side's `n` tokens to keep for the pair truncation to `budget` tokens to
    treat it as the whole side: all it could keep of it (`budget`), and, for the longer side
    (`order` > 0), one more than the other side keeps, so that two long sides split an odd
    budget as they would whole (the longer side gets the odd token)."""
    if order <= 0:
        return min(n, budget)
    return min(n, max(budget, min(other, budget) + 1))


def split_types(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """On the device: (ids, token types) from ids that carry their types (`encode_pairs`)."""
    return ids & ID_MASK, ids >> TYPE_SHIFT


def reads_token_types(config: dict[str, Any], directory: Path) -> bool:
    """Whether the model is given token type ids with a pair: whether its tokenizer, as
    transformers loads it for sentence-transformers, returns them (BERT's does; RoBERTa's and
    XLM-R's do not, and their models see type 0 throughout)."""
    tokenizer_config = _tokenizer_config(directory)
    names = tokenizer_config.get("model_input_names")
    if names is None:
        # Which class transformers picks (tokenizer_class, model_type, and exceptions) is its
        # own business: ask it.
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(
                str(directory), local_files_only=True, trust_remote_code=False
            )
        except (OSError, ValueError) as exc:
            raise InvalidModel(
                f"transformers cannot load this model's tokenizer, so what its pairs are given "
                f"is unknown ({type(exc).__name__}: {str(exc)[:200]})",
                param="model",
            ) from None
        names = tokenizer.model_input_names
    if not isinstance(names, list):
        raise InvalidModel(f"tokenizer_config.json: model_input_names {names!r} is not a list")
    if "token_type_ids" not in names:
        return False
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and vocab > ID_MASK + 1:
        raise InvalidModel(
            f"the model reads token types and has {vocab} token ids: embedx carries a pair's "
            f"types in its ids' high bits and so serves pairs of models with up to 2**{TYPE_SHIFT}"
        )
    return True


def pair_max_length(config: dict[str, Any], directory: Path) -> int | None:
    """The length CrossEncoder truncates pairs to: a saved CrossEncoder's max_seq_length, else
    the tokenizer's model_max_length capped at the model's max_position_embeddings; None where
    neither says (no limit but the model's own)."""
    if saved_cross_encoder(directory) is not None:
        stated = _saved_max_length(directory)
        if stated is not None:
            return stated
    stated_limit = _tokenizer_config(directory).get("model_max_length")
    limit = int(stated_limit) if isinstance(stated_limit, int | float) else UNLIMITED
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions != -1:
        limit = min(limit, positions)
    return limit if limit < UNLIMITED else None


def _saved_max_length(directory: Path) -> int | None:
    """The max_seq_length (or the tokenizer's model_max_length) a saved CrossEncoder's
    Transformer module states; sentence-transformers sets it without the position cap."""
    for name in ST_MODULE_CONFIGS:
        path = directory / name
        if path.is_file():
            module = read_json(path)
            if not isinstance(module, dict):
                raise InvalidModel(f"{path} is not a JSON object", param="model")
            processor = module.get("processor_kwargs") or module.get("tokenizer_args") or {}
            stated = processor.get("model_max_length") or module.get("max_seq_length")
            return int(stated) if stated else None
    return None


def _tokenizer_config(directory: Path) -> dict[str, Any]:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    settings = read_json(path)
    if not isinstance(settings, dict):
        raise InvalidModel(f"{path} is not a JSON object", param="model")
    return settings
