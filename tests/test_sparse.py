"""SPLADE: sparse rows equal to sentence-transformers' SparseEncoder, through the library and the
server (TEI's /embed_sparse, OpenAI's sparse form), top-k, and the errors of asking a model for
rows it does not give."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedx import Embedder
from embedx.engine import SparseRow
from embedx.errors import InvalidModel, InvalidOption, WrongModelTask
from tests.support.models import SPLADE_POOLINGS, build_tiny_splade
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
