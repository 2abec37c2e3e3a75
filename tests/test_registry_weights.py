"""Shared weights: catalog names over one source (its revision, dtype, length and pooling)
hold one resident copy of its weights and one queue, each name with its own prompts and
keep-alive; the residency cap counts copies, and a name evicted leaves its copy to the
names that still serve it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedx.config import load_settings
from embedx.devices import CpuAccelerator
from embedx.engine import EngineState, NamedEngine
from embedx.errors import ConfigError
from embedx.models.catalog import ModelSpec, load_catalog
from embedx.models.pooling import Pooling
from embedx.registry import ModelRegistry, check_preload
from tests.support.fakes import cpu_info
from tests.support.server import in_process
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.anyio


def registry(entries: dict[str, dict[str, Any]], **settings: Any) -> ModelRegistry:
    """A registry whose catalog adds `entries` (name -> ModelSpec's fields) to the built-in
    ones, on one fake CPU device."""
    catalog = load_catalog(None)
    for name, fields in entries.items():
        catalog[name] = ModelSpec(name=name, **{"pooling": Pooling.MEAN, **fields})
    values = {"smoke_test_on_load": "false", **{k: str(v) for k, v in settings.items()}}
    return ModelRegistry(load_settings(values, environ={}), catalog, [cpu_info()], CpuAccelerator)


def weights_of(named: NamedEngine) -> Any:
    """A tensor of the name's weights on its one device."""
    return named.engine.replicas[0].model.encoder.word  # type: ignore[attr-defined]


def freed(ref: weakref.ref[Any]) -> Callable[[], bool]:
    def check() -> bool:  # unloading runs in the background
        gc.collect()
        return ref() is None

    return check


async def test_two_names_over_one_source_hold_one_copy_of_its_weights(
    tiny_models: dict[str, Path],
) -> None:
    source = str(tiny_models["bert-base"])
    models = registry({"first": {"source": source}, "second": {"source": source}})
    async with models.lease("first") as first, models.lease("second") as second:
        held = weakref.ref(weights_of(first))
        assert weights_of(second) is held()
        assert first.engine is second.engine  # and its one queue
        assert [first.spec.name, second.spec.name] == ["first", "second"]
    assert models.loads.done == 1
    await models.drain(5)
    del first, second
    await eventually_async(freed(held), message="the shared weights outlived both names")


async def test_the_cap_counts_copies_of_weights_not_names(tiny_models: dict[str, Path]) -> None:
    source = str(tiny_models["bert-base"])
    names = [f"task-{i}" for i in range(5)]
    models = registry({name: {"source": source} for name in names}, max_loaded_models=2)
    for name in names:  # five names, one copy: all resident, nothing evicted
        async with models.lease(name):
            pass
    assert {r.spec.name for r in models.residents()} == set(names)
    assert (models.loads.done, models.evictions) == (1, 0)
    models.catalog["large"] = ModelSpec(
        "large", str(tiny_models["bert-large"]), pooling=Pooling.MEAN
    )
    async with models.lease("large"):  # a second copy: still within the cap of 2
        pass
    assert models.evictions == 0
    models.catalog["qwen"] = ModelSpec("qwen", str(tiny_models["qwen3-0.6b"]), pooling=Pooling.MEAN)
    async with models.lease("qwen"):  # a third: the least recently used copy goes, every name
        pass
    assert {r.spec.name for r in models.residents()} == {"large", "qwen"}
    await models.drain(5)


async def test_evicting_one_name_keeps_the_weights_and_queue_another_serves(
    tiny_models: dict[str, Path],
) -> None:
    source = str(tiny_models["bert-base"])
    models = registry({"kept": {"source": source}, "brief": {"source": source, "keep_alive_s": 0}})
    async with models.lease("kept") as kept:
        async with models.lease("brief") as brief:
            held = weakref.ref(weights_of(brief))
        assert [r.spec.name for r in models.residents()] == ["kept"]  # brief: keep_alive 0
        assert models.evictions == 1
        gc.collect()
        assert held() is not None, "evicting one name dropped weights another serves"
        assert kept.engine.state is EngineState.READY
        assert (await kept.embed(["still served"])).vectors.shape[0] == 1
    async with models.lease("brief") as brief:  # back, over the copy still resident
        assert weights_of(brief) is held()
    assert models.loads.done == 1
    await models.drain(5)
    del kept, brief
    await eventually_async(freed(held), message="the weights outlived their last name")


async def test_a_name_that_loads_other_weights_from_one_source_gets_its_own_copy(
    tiny_models: dict[str, Path],
) -> None:
    source = str(tiny_models["bert-base"])
    models = registry({
        "plain": {"source": source},
        "again": {"source": source},  # shares plain's
        "half": {"source": source, "dtype": "bfloat16"},
        "short": {"source": source, "max_seq_len": 16},
        "cls": {"source": source, "pooling": Pooling.CLS},  # pooled in the forward
    })  # fmt: skip
    for name in ("plain", "again", "half", "short", "cls"):
        async with models.lease(name):
            pass
    assert models.loads.done == 4
    ids = {entry["model"]: entry["weights"] for entry in models.describe()}
    assert ids["plain"] == ids["again"]
    assert len({ids[name] for name in ("plain", "half", "short", "cls")}) == 4
    await models.drain(5)


async def test_names_over_one_copy_answer_with_their_own_prompts_and_info_shows_it(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    source = tiny_models["bert-base"]
    slot = 'prompts = { query = "Instruct: {instruction}\\nQuery: {text}", passage = "{text}" }\n'
    models_file = tmp_path / "models.toml"
    models_file.write_text(
        f'[models.search]\nsource = "{source}"\npooling = "cls"\n{slot}'
        'default_instruction = "Find passages"\n'
        f'[models.classify]\nsource = "{source}"\npooling = "cls"\n{slot}'
        'default_instruction = "Classify the review"\n'
        f'[models.plain]\nsource = "{source}"\npooling = "cls"\n'
    )
    texts = ["The quick brown fox", "A lazy dog"]
    async with in_process({"models_file": models_file}) as app:

        async def vectors(model: str, sent: list[str], **fields: Any) -> np.ndarray:
            body = {"model": model, "input": sent, **fields}
            response = await app.client.post("/v1/embeddings", json=body)
            assert response.status_code == 200, response.text
            return np.array([item["embedding"] for item in response.json()["data"]])

        for name, instruction in (("search", "Find passages"), ("classify", "Classify the review")):
            by_hand = [f"Instruct: {instruction}\nQuery: {text}" for text in texts]
            asked = await vectors(name, texts, input_type="query")
            assert np.array_equal(asked, await vectors("plain", by_hand)), name
        assert np.array_equal(await vectors("search", texts, input_type="passage"),
                              await vectors("plain", texts))  # fmt: skip
        assert app.state.registry.loads.done == 1
        info = (await app.client.get("/info")).json()
        entries = {entry["model"]: entry for entry in info["models"]}
        assert {entry["weights"] for entry in entries.values()} == {entries["plain"]["weights"]}
        assert set(entries["search"]["shares_weights_with"]) == {"classify", "plain"}


def test_preloading_names_over_one_source_counts_one_copy_against_the_cap(
    tiny_models: dict[str, Path],
) -> None:
    one, other = str(tiny_models["bert-base"]), str(tiny_models["xlm-roberta-large"])
    catalog = {
        name: ModelSpec(name=name, source=source, pooling=Pooling.MEAN)
        for name, source in (("first", one), ("second", one), ("third", other))
    }
    capped = load_settings({"preload": "first,second", "max_loaded_models": "1"}, environ={})
    check_preload(capped, catalog)  # one copy: it fits
    over = load_settings({"preload": "first,third", "max_loaded_models": "1"}, environ={})
    with pytest.raises(ConfigError, match=r"over 2 copies of weights, more than .* \(1\)"):
        check_preload(over, catalog)
