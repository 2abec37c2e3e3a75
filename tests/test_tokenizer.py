"""Texts far longer than the model reads: tokenized from a window of their start, to exactly
the tokens of tokenizing them whole, at a bounded cost, whatever their script."""

from __future__ import annotations

import asyncio
import base64
import random
import shutil
import string
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedx.errors import InputTooLong
from embedx.models.source import ModelFiles, resolve
from embedx.models.tokenizer import TextTokenizer
from embedx.models.windows import CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN
from tests.support.models import MINILM_NAME
from tests.support.server import running_server
from tests.support.waiting import eventually

FAMILIES = ("MiniLM's WordPiece", "byte-level BPE, Qwen's split", "Unigram, Metaspace")
CJK = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可生天会自"
EMOJI = "👩‍👩‍👧👍🏽😀🇫🇷✨"
MIXED = "Привет мир 你好世界 مرحبا بالعالم नमस्ते दुनिया Ελληνικά hello "


def _trained(kind: str, texts: list[str]) -> Any:
    """A small tokenizer of another family, trained here (no hub) on `texts`."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    if kind == "byte-level BPE, Qwen's split":
        tokenizer = Tokenizer(models.BPE())
        pattern = Regex(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(pattern, "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer: Any = trainers.BpeTrainer(vocab_size=800, initial_alphabet=alphabet)
    else:  # unigram, as sentencepiece models (XLM-R) have it: CJK is one word, spaceless
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=800, unk_token="<unk>", special_tokens=["<unk>"]
        )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


@pytest.fixture(scope="session")
def families(
    minilm_dir: Path, reference_texts: list[str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """A directory with the tokenizer.json of each family."""
    corpus = [*reference_texts, CJK * 3, EMOJI * 3, MIXED * 3, "cafe\u0301 " * 3]
    directories = {}
    for family in FAMILIES:
        directory = tmp_path_factory.mktemp("tokenizer")
        if family == "MiniLM's WordPiece":
            shutil.copy(minilm_dir / "tokenizer.json", directory)
        else:
            _trained(family, corpus).save(str(directory / "tokenizer.json"))
        directories[family] = directory
    return directories


def whole(directory: Path, length: int) -> Any:
    """The family's tokenizer as tokenizing a text whole and truncating it gives its tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(length)
    return tokenizer


def adversarial(cut: int, bound: int) -> dict[str, str]:
    """Texts over the window of `cut` characters that no space cuts, or whose cut is awkward."""
    rng = random.Random(0)
    cjk = "".join(rng.choice(CJK) for _ in range(3 * bound))
    alnum = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(3 * bound))
    accented = "cafe\u0301 "  # the window ends between the e and its accent, the mark next:
    shift = (cut - 4) % len(accented)
    return {
        "CJK without spaces": cjk,
        "CJK just over the window": cjk[: cut + 1],
        "CJK just over the wider window": cjk[: bound + 1],
        "a.a.a.": "a." * bound,
        "a base64 blob": base64.b64encode(rng.randbytes(2 * bound)).decode(),
        "one giant alphanumeric word": alnum,
        "a giant word, then words": alnum[: cut + 7] + " word" * bound,
        "emoji": EMOJI * bound,
        "emoji between spaces": (EMOJI + " ") * bound,
        "mixed scripts": MIXED * (bound // 8),
        "mixed scripts without spaces": MIXED.replace(" ", "") * (bound // 8),
        "runs of spaces and newlines": ("a" + " " * 37 + "\n" * 11 + "\t b\r\n") * (bound // 8),
        "a run of spaces across the window": "a b " + " " * cut + "c d " * bound,
        "combining accents at the cut": "z" * shift + accented * bound,
        "combining accents after the e at the cut": "z" * (shift + 1) + accented * bound,
        # to BERT, which drops the accents, a word of a hundred letters or more is one [UNK]:
        # its first windows hold fewer, in many tokens
        "a word its accents shorten": ("x" + "\u0301" * 5) * bound,
        "its special tokens": "[SEP]<unk>[CLS] " * bound,
        "words far over the window": "word " * (20 * bound),
        "words just over the window": ("w " * cut)[: cut + 1],
    }


def encode_alone(tokenizer: TextTokenizer, text: str) -> tuple[list[int], int, bool]:
    """One text's ids, whether it counted as truncated, and whether it was read only to the
    bound."""
    at_bound = tokenizer.windows.cut_at_bound
    encoded = tokenizer.encode_now([text])
    return encoded.views()[0].tolist(), encoded.truncated, tokenizer.windows.cut_at_bound > at_bound


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("length", [16, 64])
def test_an_over_long_text_gets_the_tokens_of_tokenizing_it_whole_whatever_its_script(
    families: dict[str, Path], reference_texts: list[str], family: str, length: int
) -> None:
    tokenizer = TextTokenizer(ModelFiles(families[family], (), {}), length)
    assert tokenizer.windows.cut_at == CHARS_PER_TOKEN * length
    assert tokenizer.windows.read_at_most == MAX_CHARS_PER_TOKEN * length
    texts = adversarial(tokenizer.windows.cut_at, tokenizer.windows.read_at_most)
    reference = whole(families[family], length)
    for name, text in texts.items():
        expected = reference.encode(text)
        ids, truncated, at_bound = encode_alone(tokenizer, text)
        assert ids == expected.ids, name
        # read to the bound only where the whole text does not fill the model either (one
        # giant word, one [UNK] for WordPiece: emoji are no punctuation to BERT)
        assert not at_bound or not expected.overflowing, name
        assert truncated == (bool(expected.overflowing) or at_bound), name
    # and all at once, among ordinary texts, as a call takes them: off the loop, in chunks
    every = [*reference_texts, *texts.values()]
    expected_ids = [e.ids for e in reference.encode_batch_fast(every)]
    assert [list(ids) for ids in tokenizer.encode_now(every).views()] == expected_ids

    async def served() -> list[list[int]]:
        return [
            list(ids) async for _, chunk in tokenizer.encode_chunks(every) for ids in chunk.views()
        ]

    assert asyncio.run(served()) == expected_ids
    assert tokenizer.windows.cut >= 3 * len(texts)


RUNS = (
    *CJK[:4], "a.", "a", "word ", " ", "\n", "\t", "\r\n", "QUJD", "+/=", "e\u0301", "\u0301",
    *EMOJI, "🏽", *MIXED.split(), "xxxxxxx", "1234", "[SEP]", "<unk>", "Σ", "\u200d", "ﬁ",
)  # fmt: skip


@pytest.fixture(scope="module")
def tokenizers_at_8(families: dict[str, Path]) -> dict[str, tuple[TextTokenizer, Any]]:
    return {
        family: (TextTokenizer(ModelFiles(directory, (), {}), 8), whole(directory, 8))
        for family, directory in families.items()
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    family=st.sampled_from(FAMILIES),
    runs=st.lists(st.tuples(st.sampled_from(RUNS), st.integers(1, 300)), min_size=1, max_size=8),
)
def test_any_text_gets_the_tokens_of_tokenizing_it_whole_or_of_reading_it_to_the_bound(
    tokenizers_at_8: dict[str, tuple[TextTokenizer, Any]],
    family: str,
    runs: list[tuple[str, int]],
) -> None:
    tokenizer, reference = tokenizers_at_8[family]
    text = "".join(run * count for run, count in runs)
    ids, truncated, at_bound = encode_alone(tokenizer, text)
    read = text[: tokenizer.windows.read_at_most] if at_bound else text
    expected = reference.encode(read)
    assert ids == expected.ids
    assert truncated == (bool(expected.overflowing) or at_bound)


class Counted:
    """A tokenizer that counts the characters it is given to encode."""

    def __init__(self, tokenizer: Any, chars: list[int]) -> None:
        self._tokenizer = tokenizer
        self._chars = chars

    def encode_batch(self, texts: list[str], **options: Any) -> Any:
        self._chars.append(sum(map(len, texts)))
        return self._tokenizer.encode_batch(texts, **options)

    def encode_batch_fast(self, texts: list[str], **options: Any) -> Any:
        self._chars.append(sum(map(len, texts)))
        return self._tokenizer.encode_batch_fast(texts, **options)

    def post_process(self, *args: Any) -> Any:
        return self._tokenizer.post_process(*args)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_text_costs_the_tokenizer_more_characters_than_its_bound(
    families: dict[str, Path], family: str
) -> None:
    tokenizer = TextTokenizer(ModelFiles(families[family], (), {}), 256)
    chars: list[int] = []
    tokenizer._tokenizer = Counted(tokenizer._tokenizer, chars)  # type: ignore[assignment]
    tokenizer.windows._windows = Counted(tokenizer.windows._windows, chars)  # type: ignore[assignment]
    bound = (16 + 32 + 64) * 256  # its windows at most, as CHARS_PER_TOKEN documents
    rng = random.Random(0)
    five_mb = "".join(rng.choice(CJK) for _ in range(5_000_000 // 3))
    texts = {
        **adversarial(tokenizer.windows.cut_at, tokenizer.windows.read_at_most),
        "5 MB of CJK": five_mb,
        "5 MB of spaces": " " * 5_000_000,
        "a 5 MB word": "x" * 5_000_000,
        "5 MB of words": "word " * 1_000_000,
    }
    spent = {}
    for name, text in texts.items():
        chars.clear()
        tokenizer.encode_now([text])
        spent[name] = sum(chars)
    assert max(spent.values()) <= bound, spent
    if family == FAMILIES[0]:  # BERT makes each CJK character a word: one window settles it
        assert spent["5 MB of CJK"] == tokenizer.windows.cut_at


def test_a_text_read_only_to_the_bound_counts_as_truncated_and_is_refused_without_it(
    families: dict[str, Path],
) -> None:
    directory = families["MiniLM's WordPiece"]
    tokenizer = TextTokenizer(ModelFiles(directory, (), {}), 16)
    # a word, then more spaces than the bound: the next word is past what any text may cost
    text = "first" + " " * tokenizer.windows.read_at_most + "second"
    encoded = tokenizer.encode_now(["short", text])
    assert encoded.truncated == 1
    assert tokenizer.windows.cut_at_bound == 1
    first = whole(directory, 16).encode("first").ids
    assert encoded.views()[1].tolist() == first
    with pytest.raises(InputTooLong, match=f"input 1 is longer than {16 * 64} characters"):
        tokenizer.encode_now(["short", text], truncate=False)


def test_an_idle_tokenizer_holds_none_of_the_texts_it_encoded(minilm_dir: Path) -> None:
    """Its threads wait for the next call: a 30 MB text of the last one would stay alive."""
    tokenizer = TextTokenizer(resolve(str(minilm_dir)), 256)
    texts = ["字" * 100_000, "a short one"]
    held = [sys.getrefcount(text) for text in texts]

    async def encode() -> None:
        async for _ in tokenizer.encode_chunks(texts):
            pass

    try:
        asyncio.run(encode())
        # the threads let go once they have handed out
        eventually(lambda: [sys.getrefcount(text) for text in texts] == held)
    finally:
        tokenizer.close()


# -- through the real server ---------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def roomy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_server(
        tmp_path_factory.mktemp("server"), preload=MINILM_NAME, max_request_bytes=8_000_000
    ) as running:
        yield running


def embed(server: Any, text: str) -> np.ndarray:
    body = {"model": MINILM_NAME, "input": text, "encoding_format": "float"}
    response = httpx.post(  # UTF-8, as clients send JSON: not six bytes a CJK character
        server.url + "/v1/embeddings",
        content=orjson.dumps(body),
        headers={"content-type": "application/json"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return np.array(response.json()["data"][0]["embedding"], dtype=np.float32)


@pytest.mark.process
def test_a_5_mb_cjk_text_is_answered_beside_another_request_and_memory_goes_back(
    roomy_server: Any,
) -> None:
    from embedx import Embedder

    rng = random.Random(1)
    text = "".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(5_000_000 // 3))
    pid = roomy_server.process.pid
    for _ in range(3):  # warm: a full-length text, so later batches allocate nothing new
        embed(roomy_server, "word " * 400)
    before = rss_mb(pid)
    answers: dict[str, np.ndarray] = {}

    def big() -> None:
        answers["big"] = embed(roomy_server, text)

    sending = threading.Thread(target=big)
    sending.start()
    answers["small"] = embed(roomy_server, "a short text")  # served while the big one is
    sending.join()
    with Embedder(MINILM_NAME) as library:
        # its first 1000 characters hold more tokens than the model reads
        assert np.allclose(answers["big"], library.embed([text[:1000]])[0], atol=1e-6)
        assert np.allclose(answers["small"], library.embed(["a short text"])[0], atol=1e-6)
    info = httpx.get(roomy_server.url + "/info").json()
    model = next(m for m in info["models"] if m["model"] == MINILM_NAME)
    assert model["tokenizer"]["cut"] == 1
    assert model["tokenizer"]["cut_at_bound"] == 0
    # memory goes back after the request, on a thread
    eventually(lambda: rss_mb(pid) <= 1.1 * before, message="its memory never went back")
