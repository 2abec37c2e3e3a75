"""SPLADE: sparse rows equal to sentence-transformers' SparseEncoder, through the library and the
server (TEI's /embed_sparse, OpenAI's sparse form), top-k, what leaves the device for them (each
row's non-zeros, not the vocabulary), and the errors of asking a model for rows it does not
give."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embedx import Embedder
from embedx.engine import SparseRow
from embedx.engine.compact_rows import FIRST_CAPACITY, Compactor
from embedx.errors import InvalidModel, InvalidOption, WrongModelTask
from tests.support.models import SPLADE_POOLINGS, build_sparser_splade, build_tiny_splade
from tests.support.server import InProcess, assert_envelope, in_process, post, running_server

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory, reference_texts: list[str]) -> dict[str, Path]:
    return build_tiny_splade(tmp_path_factory.mktemp("splade"), reference_texts)


@pytest.fixture(scope="module")
def texts(reference_texts: list[str]) -> list[str]:
    return [*reference_texts[:6], "a", "the the the"]


def sparse_encoder_rows(directory: Path, texts: list[str]) -> np.ndarray:
    """sentence-transformers' SparseEncoder.encode, as (N, V) float32."""
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(directory), device="cpu")
    rows: np.ndarray = model.encode(texts, convert_to_tensor=True).to_dense().numpy()
    return rows


def dense(rows: list[SparseRow], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width), np.float32)
    for i, row in enumerate(rows):
        assert np.all(np.diff(row.indices) > 0), "indices ascend"
        assert np.all(row.values > 0)
        out[i, row.indices] = row.values
    return out


@pytest.mark.parametrize("pooling", SPLADE_POOLINGS)
def test_splade_rows_equal_sentence_transformers_sparse_encoder(
    splade: dict[str, Path], texts: list[str], pooling: str
) -> None:
    expected = sparse_encoder_rows(splade[pooling], texts)
    with Embedder(splade[pooling]) as embedder:
        rows = embedder.embed_sparse(texts)
    assert np.abs(dense(rows, expected.shape[1]) - expected).max() < TOLERANCE
    counts = [len(row.indices) for row in rows]
    assert counts == np.count_nonzero(expected, axis=1).tolist()


def test_splade_through_transformers_equals_sentence_transformers(
    splade: dict[str, Path], texts: list[str]
) -> None:
    """The fallback for masked LMs embedx has no code for: AutoModelForMaskedLM, padded."""
    import torch

    from embedx.models.packing import pack, to_device
    from embedx.models.source import resolve
    from embedx.models.splade import SpladeModel
    from embedx.models.task import task_of
    from embedx.models.tokenizer import TextTokenizer

    files = resolve(str(splade["sum-log1p_relu"]))
    splade_pooling = task_of(files.config, files.directory).splade
    assert splade_pooling is not None
    cpu = torch.device("cpu")
    model = SpladeModel(files, splade_pooling, cpu, "float32", "transformers")
    assert model.implementation == "transformers"
    ids = TextTokenizer(files, 512).encode_now(texts).views()
    rows = model.forward(to_device(pack(ids), cpu)).numpy()
    expected = sparse_encoder_rows(splade["sum-log1p_relu"], texts)
    assert np.abs(rows - expected).max() < TOLERANCE


@pytest.mark.parametrize("pooling", SPLADE_POOLINGS)
@pytest.mark.parametrize("pool", ["_by_segments", "_by_scatter"])  # a GPU's, a CPU's
def test_the_decoder_runs_on_chunks_of_tokens_and_texts_across_chunks_pool_whole(
    splade: dict[str, Path], texts: list[str], pooling: str, pool: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """At most CHUNK logits exist at once: here 7 tokens' a chunk, so that most texts span
    several, each pooled from all its tokens as SparseEncoder pools them."""
    from embedx.models import splade as splade_module
    from embedx.models.packing import pack, to_device
    from embedx.models.source import resolve
    from embedx.models.splade import SpladeModel
    from embedx.models.task import task_of
    from embedx.models.tokenizer import TextTokenizer

    files = resolve(str(splade[pooling]))
    splade_pooling = task_of(files.config, files.directory).splade
    assert splade_pooling is not None
    cpu = torch.device("cpu")
    model = SpladeModel(files, splade_pooling, cpu, "float32")
    model._pool = getattr(splade_module, pool)
    monkeypatch.setattr(splade_module, "CHUNK", 7 * model.dimensions)
    chunks: list[int] = []
    decode = model.logits

    def counted(states: torch.Tensor) -> torch.Tensor:
        chunks.append(len(states))
        logits: torch.Tensor = decode(states)
        return logits

    model.logits = counted
    ids = TextTokenizer(files, 512).encode_now(texts).views()
    rows = model.forward(to_device(pack(ids), cpu)).numpy()
    assert max(chunks) == 7
    assert sum(chunks) == sum(len(row) for row in ids)
    expected = sparse_encoder_rows(splade[pooling], texts)
    assert np.abs(rows - expected).max() < TOLERANCE


def test_a_stated_splade_pooling_makes_a_masked_lm_sparse(
    splade: dict[str, Path], texts: list[str]
) -> None:
    """A masked LM with no sentence-transformers files, its pooling stated as a catalog entry
    or first request states it: SPLADE v2's max of log(1 + relu)."""
    expected = sparse_encoder_rows(splade["max-relu"], texts)
    with Embedder(splade["mlm"], pooling="splade") as embedder:
        rows = embedder.embed_sparse(texts)
    assert np.abs(dense(rows, expected.shape[1]) - expected).max() < TOLERANCE


def test_top_k_keeps_each_rows_largest_weights_in_index_order(
    splade: dict[str, Path], texts: list[str]
) -> None:
    with Embedder(splade["max-relu"]) as embedder:
        full = embedder.embed_sparse(texts)
        pruned = embedder.embed_sparse(texts, top_k=5)
        with pytest.raises(InvalidOption, match="top_k"):
            embedder.embed_sparse(texts, top_k=0)
    for whole, top in zip(full, pruned, strict=True):
        assert len(top.indices) == 5
        assert np.all(np.diff(top.indices) > 0)
        assert np.isin(top.indices, whole.indices).all()
        assert top.values.min() >= np.sort(whole.values)[-5]


# -- what leaves the device -------------------------------------------------------------------


def synthetic_rows(counts: list[int], vocab: int = 30522) -> torch.Tensor:
    """(B, V) rows of SPLADE's kind: row b has counts[b] weights above 0, the rest 0."""
    rng = np.random.default_rng(0)
    rows = np.zeros((len(counts), vocab), np.float32)
    for b, count in enumerate(counts):
        rows[b, rng.choice(vocab, count, replace=False)] = rng.uniform(0.01, 3, count)
    return torch.from_numpy(rows)


def cut_and_read(compactor: Compactor, rows: torch.Tensor, top_k: int | None = None) -> Any:
    block = compactor.cut(rows, top_k)
    compactor.keep(0, block, rows)
    return block, compactor.taken(block)


def test_each_row_leaves_the_device_as_its_non_zeros_within_the_capacity() -> None:
    rows = synthetic_rows([3, 40, 0, 120])
    compactor = Compactor()
    block, read = cut_and_read(compactor, rows)
    k = compactor.capacity
    assert k == FIRST_CAPACITY
    assert block.numel() == 1 + len(rows) * (1 + 2 * k)  # k weights and ids a row, and its count
    assert block.numel() < rows.numel() / 50
    for b in range(len(rows)):
        assert_same_row(read.sparse(None).row(b), rows[b].numpy())
        assert_same_row(read.sparse(2).row(b), rows[b].numpy(), top=2)


def test_with_top_k_each_row_sends_at_most_k_weights() -> None:
    rows = synthetic_rows([3, 40, 0, 120])
    block, read = cut_and_read(Compactor(), rows, top_k=5)
    assert block.numel() == 1 + len(rows) * (1 + 2 * 5)
    for b in range(len(rows)):
        assert_same_row(read.sparse(5).row(b), rows[b].numpy(), top=5)


def test_a_row_past_the_capacity_comes_whole_and_the_capacity_grows_to_cover_it() -> None:
    rows = synthetic_rows([10, FIRST_CAPACITY + 44, 7])
    compactor = Compactor()
    _, read = cut_and_read(compactor, rows)
    for b in range(len(rows)):
        assert_same_row(read.sparse(None).row(b), rows[b].numpy())
        top = FIRST_CAPACITY + 10  # past the cut too
        assert_same_row(read.sparse(top).row(b), rows[b].numpy(), top=top)
    assert compactor.capacity == 2 * FIRST_CAPACITY  # a power of two, at most twice the most
    block, read = cut_and_read(compactor, rows)
    assert block.numel() == 1 + len(rows) * (1 + 4 * FIRST_CAPACITY)
    assert_same_row(read.sparse(None).row(1), rows[1].numpy())


def test_rows_too_full_for_a_cut_come_back_whole() -> None:
    rows = synthetic_rows([500, 900], vocab=1000)
    compactor = Compactor()
    compactor.capacity = 512  # 2k + 1 >= V: a cut would send more than the rows
    block, read = cut_and_read(compactor, rows)
    assert block.numel() == 1 + rows.numel()
    assert_same_row(read.sparse(None).row(1), rows[1].numpy())


def assert_same_row(row: SparseRow, whole: np.ndarray, top: int | None = None) -> None:
    indices = np.flatnonzero(whole)
    if top is not None and len(indices) > top:
        indices = np.sort(np.argsort(-whole)[:top])
    assert row.indices.dtype == np.int64
    assert row.indices.tolist() == indices.tolist()
    assert np.array_equal(row.values, whole[indices])


@pytest.fixture
def blocks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """(texts, vocabulary, floats sent) of each batch the engine's Compactor cuts."""
    seen: list[tuple[int, int, int]] = []
    cut = Compactor.cut

    def recorded(self: Compactor, rows: torch.Tensor, top_k: int | None) -> torch.Tensor:
        block = cut(self, rows, top_k)
        seen.append((rows.shape[0], rows.shape[1], block.numel()))
        return block

    monkeypatch.setattr(Compactor, "cut", recorded)
    return seen


@pytest.fixture(scope="module")
def sparser(splade: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sparser_splade(splade["max-relu"], tmp_path_factory.mktemp("sparser"))


def test_sparse_rows_cut_on_the_device_equal_sparse_encoders_and_send_no_vocabulary(
    sparser: Path, texts: list[str], blocks: list[tuple[int, int, int]]
) -> None:
    expected = sparse_encoder_rows(sparser, texts)
    counts = np.count_nonzero(expected, axis=1)
    assert 0 < counts.max() <= FIRST_CAPACITY < expected.shape[1] / 2  # the cut's own case
    with Embedder(sparser) as embedder:
        rows = embedder.embed_sparse(texts)
        pruned = embedder.embed_sparse(texts, top_k=4)
    assert np.abs(dense(rows, expected.shape[1]) - expected).max() < TOLERANCE
    assert [len(row.indices) for row in rows] == counts.tolist()
    assert [len(row.indices) for row in pruned] == np.minimum(counts, 4).tolist()
    *whole, last = blocks  # the smoke test's batch and the first request's; the second's
    for count, vocab, sent in whole:  # each row: its count, and as many weights and ids
        assert sent == 1 + count * (1 + 2 * FIRST_CAPACITY) < count * vocab
    assert last[2] == 1 + last[0] * (1 + 2 * 4)  # top_k 4: 4 weights a row


def test_asking_a_model_for_rows_it_does_not_give_is_an_error(
    splade: dict[str, Path], tiny_models: dict[str, Path]
) -> None:
    with Embedder(splade["max-relu"]) as embedder:
        with pytest.raises(WrongModelTask, match="gives sparse rows; it has no dense"):
            embedder.embed(["a text"])
        with pytest.raises(WrongModelTask, match="no colbert"):
            embedder.embed_outputs(["a text"], ("sparse", "colbert"))
    with (
        Embedder(tiny_models["bert-base"], pooling="cls") as embedder,
        pytest.raises(WrongModelTask, match="gives dense rows; it has no sparse"),
    ):
        embedder.embed_sparse(["a text"])


def test_splade_pooling_of_a_model_that_is_no_masked_lm_is_refused(
    splade: dict[str, Path], tiny_models: dict[str, Path]
) -> None:
    with pytest.raises(InvalidModel, match=r"masked LM \(an architecture \*ForMaskedLM\)"):
        Embedder(tiny_models["bert-base"], pooling="splade")
    with pytest.raises(InvalidOption, match="SPLADE sparse encoder"):
        Embedder(splade["max-relu"], pooling="mean")


# -- through the server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide: the app below serves the server's tests


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[InProcess]:
    async with in_process({"allow_local_paths": True}) as app:
        yield app


def tei_rows(body: Any, width: int) -> np.ndarray:
    out = np.zeros((len(body), width), np.float32)
    for i, row in enumerate(body):
        indices = [entry["index"] for entry in row]
        assert indices == sorted(indices)
        out[i, indices] = [entry["value"] for entry in row]
    return out


@pytest.mark.anyio
async def test_embed_sparse_answers_as_tei_with_sparse_encoders_rows(
    served: InProcess, splade: dict[str, Path], texts: list[str]
) -> None:
    expected = sparse_encoder_rows(splade["max-relu"], texts)
    model = str(splade["max-relu"])
    response = await served.client.post("/embed_sparse", json={"model": model, "inputs": texts})
    assert response.status_code == 200, response.text
    assert np.abs(tei_rows(response.json(), expected.shape[1]) - expected).max() < TOLERANCE
    body = {"model": model, "inputs": texts[0], "top_k": 3}
    pruned = (await served.client.post("/embed_sparse", json=body)).json()
    assert len(pruned) == 1
    assert len(pruned[0]) == 3


@pytest.mark.anyio
async def test_openai_embeddings_give_sparse_rows_as_indices_and_values(
    served: InProcess, splade: dict[str, Path], texts: list[str]
) -> None:
    expected = sparse_encoder_rows(splade["max-relu"], texts)
    body = {"model": str(splade["max-relu"]), "input": texts, "encoding_format": "sparse"}
    response = await served.client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    rows = [SparseRow(np.array(item["embedding"]["indices"]),
                      np.array(item["embedding"]["values"], np.float32))
            for item in response.json()["data"]]  # fmt: skip
    assert np.abs(dense(rows, expected.shape[1]) - expected).max() < TOLERANCE
    body["embedding_types"] = ["sparse"]
    keyed = (await served.client.post("/v1/embeddings", json=body)).json()["data"]
    assert keyed[0]["embedding"]["sparse"]["indices"] == rows[0].indices.tolist()


@pytest.mark.anyio
async def test_a_request_for_rows_a_model_does_not_give_is_a_400_naming_their_route(
    served: InProcess, splade: dict[str, Path], tiny_models: dict[str, Path]
) -> None:
    sparse = str(splade["max-relu"])
    for path, body in (("/embed", {"model": sparse, "inputs": "a"}),
                       ("/v1/embeddings", {"model": sparse, "input": "a"})):  # fmt: skip
        error = assert_envelope(await served.client.post(path, json=body), 400,
                                "wrong_model_task")  # fmt: skip
        assert "POST /embed_sparse" in error["message"]
    dense_model = str(tiny_models["bert-base"])
    for path, body in (
        ("/embed_sparse", {"model": dense_model, "inputs": "a", "pooling": "cls"}),
        ("/v1/embeddings", {"model": dense_model, "input": "a", "encoding_format": "sparse"}),
    ):
        error = assert_envelope(await served.client.post(path, json=body), 400,
                                "wrong_model_task")  # fmt: skip
        assert "POST /embed or POST /v1/embeddings" in error["message"]
    pruned = {"model": sparse, "inputs": "a", "top_k": 0}
    assert_envelope(await served.client.post("/embed_sparse", json=pruned), 400, "invalid_option")


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_server(tmp_path_factory.mktemp("server"), allow_local_paths=True) as server:
        yield server


def test_a_real_server_serves_embed_sparse(
    real_server: Any, splade: dict[str, Path], texts: list[str]
) -> None:
    expected = sparse_encoder_rows(splade["sum-log1p_relu"], texts)
    body = {"model": str(splade["sum-log1p_relu"]), "inputs": texts}
    response = post(real_server, "/embed_sparse", json=body)
    assert response.status_code == 200, response.text
    assert np.abs(tei_rows(response.json(), expected.shape[1]) - expected).max() < TOLERANCE
