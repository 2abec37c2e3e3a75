"""Texts far longer than the model reads, tokenized from a window of their start: the tokens
the model keeps are those of tokenizing the whole text, and no text costs the tokenizer more
than its length times MAX_CHARS_PER_TOKEN characters."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

# A text longer than this many characters per token the model reads is not tokenized whole:
# the tokenizer's time and memory follow the text's length, not what is kept of it (30 MB of
# CJK held MiniLM's tokenizer for 24 s, and the server's memory grew by 4 GB). A window of its
# first characters is tokenized instead, whatever its script (no space is needed), and wider
# ones, each twice the last, while they do not settle its kept tokens (`Windows.windowed`).
CHARS_PER_TOKEN = 16
# The widest window, in characters per token the model reads: no text costs the tokenizer
# more than its windows, max_seq_len * (16 + 32 + 64) characters. A text whose kept tokens
# even this one does not settle (its first max_seq_len tokens span more characters: words
# of a hundred characters each, or thousands of spaces) is read that far only, and counted as
# truncated.
MAX_CHARS_PER_TOKEN = 64


class Windows:
    """The windows of a model's over-long texts, on a copy of its tokenizer that neither
    truncates nor pads; `truncating` is the model's own, which cuts what a window keeps."""

    def __init__(self, whole: Tokenizer, truncating: Tokenizer, max_seq_len: int) -> None:
        self._windows = whole
        self._windows.no_padding()
        self._windows.no_truncation()
        self._truncating = truncating
        self.max_seq_len = max_seq_len
        self.cut_at = max_seq_len * CHARS_PER_TOKEN
        self.read_at_most = max_seq_len * MAX_CHARS_PER_TOKEN
        # WordPiece makes a word of more than max_input_chars_per_word characters one [UNK]:
        # the start of a word tells nothing of it (`windowed`).
        self._whole_words = _tokenizes_whole_words(whole)
        self.cut = 0  # texts longer than `cut_at`, tokenized from a window
        self.cut_at_bound = 0  # of them, those read only up to `read_at_most` characters

    def windowed(self, texts: list[str]) -> tuple[list[Encoding], list[int]]:
        """Texts longer than `cut_at`, truncated, each from a window of its first characters
        rather than whole; and which of them were read only up to `read_at_most` characters.

        A window settles its text's kept tokens where
        - they lie before its last two words: they are the whole text's (`stable_tokens`);
        - or it overflows the model with the same kept tokens as the window half its width:
          the text is one word, or starts with one, wider than that (CJK under a Metaspace
          tokenizer, a base64 blob), which words cannot settle, and twice the text did not
          change them (BPE and Unigram split a word by what is near; not WordPiece, whose
          [UNK] for a long word turns on its whole length);
        - or it is the whole text.
        Each round of windows is one call, on every core, for the texts still open; those
        that the widest leaves open get what it keeps: reading on would cost more than the
        model reads, whatever the text holds."""
        keep = self.max_seq_len
        self.cut += len(texts)
        settled: dict[int, Encoding] = {}
        last: dict[int, Encoding] = {}  # each open text's widest window so far
        open_ = list(range(len(texts)))
        width = self.cut_at
        while open_:
            windows = self._windows.encode_batch(
                [texts[i][:width] for i in open_], add_special_tokens=False
            )
            still = []
            for i, window in zip(open_, windows, strict=True):
                narrower = last.get(i)
                if len(texts[i]) <= width or stable_tokens(window.word_ids) > keep:
                    settled[i] = window
                elif (
                    narrower is not None
                    and not self._whole_words
                    and _same_kept(narrower, window, keep)
                ):
                    settled[i] = narrower
                else:
                    last[i] = window
                    still.append(i)
            open_ = still
            if width >= self.read_at_most:
                break
            width = min(2 * width, self.read_at_most)
        for i in open_:
            settled[i] = last[i]
        self.cut_at_bound += len(open_)
        post = self._truncating.post_process  # truncation and special tokens, as encode's
        return [post(settled[i], None, True) for i in range(len(texts))], open_

    def prefix(self, text: str) -> str:
        """The start of `text` whose tokens begin as the whole text's do, for at least the
        model's length (or up to `read_at_most` characters): what a pair's side is tokenized
        from. Texts up to `cut_at` characters are themselves."""
        if len(text) <= self.cut_at:
            return text
        keep = self.max_seq_len
        self.cut += 1
        width = self.cut_at
        narrower: tuple[Encoding, int] | None = None  # the last window, and its width
        while True:
            window = self._windows.encode(text[:width], add_special_tokens=False)
            if len(text) <= width or stable_tokens(window.word_ids) > keep:
                return text[:width]
            same = narrower is not None and _same_kept(narrower[0], window, keep)
            if same and narrower is not None and not self._whole_words:
                return text[: narrower[1]]
            if width >= self.read_at_most:
                self.cut_at_bound += 1
                return text[:width]
            narrower = (window, width)
            width = min(2 * width, self.read_at_most)


def stable_tokens(word_ids: list[int | None]) -> int:
    """How many of a window's first tokens are those of the whole text it starts: the tokens
    before its last two words.

    The pre-tokenizer splits text into words by what is near (a regex's lookahead reaches
    one character past a word; normalizers change characters by their neighbours), and the
    model turns each word into tokens alone: BERT's WordPiece, byte-level BPE, Metaspace
    with Unigram. So only the words that touch the window's end can differ from the whole
    text's: the last one, and the one whose lookahead reaches into it."""
    last: set[int] = set()
    for i in range(len(word_ids) - 1, -1, -1):
        word = word_ids[i]
        if word is not None and word not in last:
            if len(last) == 2:
                return i + 1
            last.add(word)
    return 0


def _tokenizes_whole_words(tokenizer: Tokenizer) -> bool:
    """Whether the model reads a word whole before splitting it: WordPiece, whose word of
    more than max_input_chars_per_word characters is one [UNK]."""
    from tokenizers.models import WordPiece

    return isinstance(tokenizer.model, WordPiece)


def _same_kept(narrow: Encoding, wide: Encoding, keep: int) -> bool:
    """Whether two windows of a text both overflow `keep` tokens, with the same first ones."""
    return (
        len(narrow) > keep and len(wide) > keep and narrow.ids[: keep + 1] == wide.ids[: keep + 1]
    )
