"""BGE-M3: dense rows, sparse weights and ColBERT vectors from one pass, equal to FlagEmbedding's
BGEM3FlagModel on tiny random weights saved as it saves them; its pickled heads refused until
`embedx convert-heads` writes them as safetensors; any subset of outputs, through the library
and the server."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import shutil
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedx import Embedder
from embedx.cli import main
from embedx.engine import SparseRow
from embedx.errors import PickleOnlyWeights
from tests.support.models import build_tiny_m3
from tests.support.server import InProcess, in_process

TOLERANCE = 1e-5


def flag_model_class() -> Any:
    """FlagEmbedding's BGEM3FlagModel (M3Embedder). Its package's __init__ imports every model
    it has, some through transformers 4's modules, which transformers 5 dropped: its parent
    packages are entered here without their __init__, so only M3's own imports run."""
    found = importlib.util.find_spec("FlagEmbedding")
    if found is None or not found.submodule_search_locations:
        pytest.skip("FlagEmbedding is not installed")
    root = Path(next(iter(found.submodule_search_locations)))
    for package in ("", ".inference", ".inference.embedder", ".inference.embedder.encoder_only"):
        name = "FlagEmbedding" + package
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(root.joinpath(*package.split(".")[1:]))]
            sys.modules[name] = module
    m3 = importlib.import_module("FlagEmbedding.inference.embedder.encoder_only.m3")
    return m3.M3Embedder


@pytest.fixture(scope="module")
def pickled(tmp_path_factory: pytest.TempPathFactory, reference_texts: list[str]) -> Path:
    """The model as FlagEmbedding saves it: heads as .pt only."""
    return build_tiny_m3(tmp_path_factory.mktemp("m3"), reference_texts)


@pytest.fixture(scope="module")
def m3(pickled: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model once `embedx convert-heads` ran on it."""
    directory = tmp_path_factory.mktemp("converted") / "m3"
    shutil.copytree(pickled, directory)
    assert main(["convert-heads", str(directory)]) == 0
    return directory


@pytest.fixture(scope="module")
def texts(reference_texts: list[str]) -> list[str]:
    return [*reference_texts[:6], "a", "the the the"]


@pytest.fixture(scope="module")
def reference(pickled: Path, texts: list[str]) -> dict[str, Any]:
    """BGEM3FlagModel's three outputs, in fp32 on the CPU, from its own files."""
    model = flag_model_class()(str(pickled), use_fp16=False, devices="cpu")
    found: dict[str, Any] = model.encode(
        texts, return_dense=True, return_sparse=True, return_colbert_vecs=True
    )
    return found


def assert_sparse_equal(rows: list[SparseRow], weights: list[dict[str, float]]) -> None:
    for row, expected in zip(rows, weights, strict=True):
        assert row.indices.tolist() == sorted(int(token) for token in expected)
        wanted = np.array([expected[str(token)] for token in row.indices.tolist()], np.float32)
        assert np.abs(row.values - wanted).max(initial=0) < TOLERANCE


def as_row(indices: list[int], values: list[float]) -> SparseRow:
    return SparseRow(np.array(indices, np.int64), np.array(values, np.float32))


def assert_colbert_equal(vectors: list[np.ndarray], expected: list[np.ndarray]) -> None:
    for got, want in zip(vectors, expected, strict=True):
        assert got.shape == want.shape
        assert np.abs(got - want).max() < TOLERANCE


def test_dense_sparse_and_colbert_equal_bge_m3s_own_from_one_pass(
    m3: Path, reference: dict[str, Any], texts: list[str]
) -> None:
    with Embedder(m3, pooling="cls") as embedder:
        rows = embedder.embed_outputs(texts)
    assert np.abs(rows["dense"] - reference["dense_vecs"]).max() < TOLERANCE
    assert_sparse_equal(rows["sparse"], reference["lexical_weights"])
    assert_colbert_equal(rows["colbert"], reference["colbert_vecs"])


def test_any_subset_of_outputs_is_asked_for_alone(
    m3: Path, reference: dict[str, Any], texts: list[str]
) -> None:
    with Embedder(m3, pooling="cls") as embedder:
        dense = embedder.embed(texts)
        sparse = embedder.embed_sparse(texts)
        pruned = embedder.embed_sparse(texts, top_k=2)
        colbert = embedder.embed_outputs(texts, ("colbert",))
    assert np.abs(dense - reference["dense_vecs"]).max() < TOLERANCE
    assert_sparse_equal(sparse, reference["lexical_weights"])
    assert all(len(row.indices) <= 2 for row in pruned)
    assert_colbert_equal(colbert["colbert"], reference["colbert_vecs"])
    assert set(colbert) == {"colbert"}


def test_requests_sharing_a_batch_read_its_merged_block_each_as_it_asked(
    m3: Path, reference: dict[str, Any], texts: list[str]
) -> None:
    """The device merges the sparse weights and drops each text's first token's vector; the
    host only reads them out. Four requests share one batch: ColBERT vectors raw and
    normalized (the batch's block holds them raw: the host normalizes one request's), sparse
    rows whole and pruned to 2."""
    import torch

    from embedx.engine.outputs import batch_form, settle, write_batch
    from embedx.engine.sparse_rows import MultiRows, settle_outputs
    from embedx.models.loader import embedding_model
    from embedx.models.m3 import M3Model
    from embedx.models.packing import pack, to_device
    from embedx.models.pooling import Pooling
    from embedx.models.source import resolve
    from embedx.models.task import task_of
    from embedx.models.tokenizer import TextTokenizer
    from embedx.scheduling.work import Item, Job

    files = resolve(str(m3))
    task = task_of(files.config, files.directory)
    cpu = torch.device("cpu")
    model = embedding_model(files, task, Pooling.CLS, cpu, "float32")
    assert isinstance(model, M3Model)
    asks = [(("colbert",), False, None), (("colbert",), True, None), (("sparse",), True, None),
            (("sparse",), True, 2)]  # fmt: skip
    jobs = [Job(len(texts)) for _ in asks]
    for job, (outputs, normalize, top_k) in zip(jobs, asks, strict=True):
        multi = settle_outputs(task, "m3", outputs, top_k)
        spec = settle(width=model.dimensions, model_normalizes=False, default_normalize=True,
                      dimensions=None, normalize=normalize, multi=multi)  # fmt: skip
        job.out = spec.rows(len(texts))
    ids = TextTokenizer(files, 512).encode_now(texts).views()
    # one batch of every request's texts
    mixed = [Item(job, i, len(row), row) for job in jobs for i, row in enumerate(ids)]
    form = batch_form(mixed, None)
    assert form.outputs == ("sparse", "colbert")
    assert not form.unit
    block = model.forward_outputs(to_device(pack([item.ids for item in mixed]), cpu),
                                  form.outputs, form.unit)  # fmt: skip
    tokens = sum(item.length for item in mixed)
    vectors = (tokens - len(mixed)) * len(reference["colbert_vecs"][0][0])
    assert block.numel() == len(mixed) + 1 + 2 * tokens + vectors  # no weight a token is left
    write_batch(mixed, None, block.numpy(), form)
    raw, unit, whole, pruned = (job.out for job in jobs)
    assert isinstance(raw, MultiRows)
    assert isinstance(unit, MultiRows)
    assert_colbert_equal(unit.colbert, reference["colbert_vecs"])
    norms = [np.linalg.norm(v, axis=1) for v in raw.colbert]
    assert not np.allclose(np.concatenate(norms), 1)
    assert_colbert_equal([v / n[:, None] for v, n in zip(raw.colbert, norms, strict=True)],
                         reference["colbert_vecs"])  # fmt: skip
    assert isinstance(whole, MultiRows)
    assert isinstance(pruned, MultiRows)
    assert_sparse_equal(whole.sparse, reference["lexical_weights"])
    for full, top in zip(whole.sparse, pruned.sparse, strict=True):
        assert len(top.indices) == min(2, len(full.indices))
        assert np.isin(top.indices, full.indices).all()
        assert np.all(np.diff(top.indices) > 0)
        assert top.values.min(initial=np.inf) >= np.sort(full.values)[-2:].min(initial=0)


def test_pickled_heads_are_refused_naming_the_conversion(pickled: Path, m3: Path) -> None:
    with pytest.raises(PickleOnlyWeights, match="embedx convert-heads DIR"):
        Embedder(pickled, pooling="cls")
    assert (m3 / "sparse_linear.safetensors").is_file()
    assert (m3 / "colbert_linear.safetensors").is_file()


def test_convert_heads_of_a_directory_without_them_fails(tmp_path: Path) -> None:
    assert main(["convert-heads", str(tmp_path)]) == 1


# -- through the server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide: the app below serves the server's tests


@pytest.fixture(scope="module")
async def served(m3: Path) -> AsyncIterator[InProcess]:
    models = m3.parent / "models.toml"
    models.write_text(f'[models.m3]\nsource = "{m3}"\npooling = "cls"\n')
    async with in_process({"models_file": str(models), "preload": "m3"}) as app:
        yield app


@pytest.mark.anyio
async def test_openai_embeddings_give_any_subset_of_outputs_by_embedding_types(
    served: InProcess, reference: dict[str, Any], texts: list[str]
) -> None:
    body = {"model": "m3", "input": texts, "embedding_types": ["float", "sparse", "colbert"]}
    response = await served.client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    items = [item["embedding"] for item in response.json()["data"]]
    dense = np.array([item["float"] for item in items], np.float32)
    assert np.abs(dense - reference["dense_vecs"]).max() < TOLERANCE
    sparse = [as_row(item["sparse"]["indices"], item["sparse"]["values"]) for item in items]
    assert_sparse_equal(sparse, reference["lexical_weights"])
    colbert = [np.array(item["colbert"], np.float32) for item in items]
    assert_colbert_equal(colbert, reference["colbert_vecs"])


@pytest.mark.anyio
async def test_requests_for_different_outputs_of_one_model_each_get_theirs(
    served: InProcess, reference: dict[str, Any], texts: list[str]
) -> None:
    """Sent together, they may share batches: each reads its own rows from their block."""
    client = served.client
    tokens_body = {"model": "m3", "input": texts, "embedding_types": ["colbert"]}
    dense, sparse, colbert = await asyncio.gather(
        client.post("/v1/embeddings", json={"model": "m3", "input": texts}),
        client.post("/embed_sparse", json={"model": "m3", "inputs": texts}),
        client.post("/v1/embeddings", json=tokens_body),
    )
    vectors = np.array([item["embedding"] for item in dense.json()["data"]], np.float32)
    assert np.abs(vectors - reference["dense_vecs"]).max() < TOLERANCE
    rows = [as_row([e["index"] for e in row], [e["value"] for e in row]) for row in sparse.json()]
    assert_sparse_equal(rows, reference["lexical_weights"])
    tokens = [np.array(item["embedding"]["colbert"], np.float32) for item in colbert.json()["data"]]
    assert_colbert_equal(tokens, reference["colbert_vecs"])
