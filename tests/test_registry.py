from __future__ import annotations

import asyncio
import gc
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest

from embedx import heap
from embedx.config import load_settings
from embedx.devices import CpuAccelerator
from embedx.engine import Engine
from embedx.errors import InvalidModel, ModelNotFound, ModelsBusy, PoolingConflict, PoolingRequired
from embedx.models.catalog import ModelSpec, load_catalog
from embedx.models.pooling import Pooling
from embedx.registry import LoadRequest, ModelRegistry, local_name
from tests.support.fakes import cpu_info
from tests.support.models import MINILM_NAME
from tests.support.waiting import eventually_async, until

pytestmark = pytest.mark.anyio


def registry(
    tiny: dict[str, Path] | None = None, local_paths: bool = True, **settings: Any
) -> ModelRegistry:
    catalog = load_catalog(None)
    for shape, directory in (tiny or {}).items():
        catalog[shape] = ModelSpec(name=shape, source=str(directory), pooling=Pooling.MEAN)
    values = {"smoke_test_on_load": "false", **{k: str(v) for k, v in settings.items()}}
    return ModelRegistry(
        load_settings(values, environ={}),
        catalog,
        [cpu_info()],
        CpuAccelerator,
        local_paths=local_paths,
    )


async def test_a_model_loads_once_however_many_ask_at_once() -> None:
    models = registry()
    loads: list[str] = []

    async def use() -> int:
        async with models.lease(MINILM_NAME) as engine:
            loads.append(engine.spec.name)
            return id(engine)

    engines = await asyncio.gather(*(use() for _ in range(5)))
    assert len(set(engines)) == 1
    assert models.loads.done == 1
    await models.drain(5)


async def test_pooling_is_required_on_first_load_and_never_guessed(minilm_dir: Path) -> None:
    models = registry()
    with pytest.raises(PoolingRequired) as caught:
        async with models.lease(str(minilm_dir)):
            pass
    assert caught.value.status == 400
    assert models.residents() == []


async def test_a_name_that_leads_nowhere_is_not_found_before_pooling_is_asked() -> None:
    with pytest.raises(ModelNotFound):
        async with registry().lease("embedx-tests/nowhere"):
            pass


def test_the_library_names_a_missing_model_and_a_missing_pooling(minilm_dir: Path) -> None:
    from embedx import Embedder

    with pytest.raises(ModelNotFound):
        Embedder("embedx-tests/nowhere")
    with pytest.raises(PoolingRequired, match="pooling='mean'"):
        Embedder(str(minilm_dir))


@pytest.mark.filterwarnings("error")  # and leaves no coroutine unawaited behind
def test_a_closed_embedder_says_so(minilm_dir: Path) -> None:
    from embedx import Embedder

    embedder = Embedder(minilm_dir, pooling="mean")  # a path as well as a string
    assert embedder.embed("x").shape == (1, 384)
    embedder.close()
    with pytest.raises(RuntimeError, match="closed"):
        embedder.embed("x")
    with pytest.raises(RuntimeError, match="closed"), embedder:
        pass


async def test_a_different_pooling_for_a_resident_model_is_a_conflict(minilm_dir: Path) -> None:
    models = registry()
    async with models.lease(str(minilm_dir), LoadRequest(pooling="mean")):
        pass
    with pytest.raises(PoolingConflict) as caught:
        async with models.lease(str(minilm_dir), LoadRequest(pooling="cls")):
            pass
    assert caught.value.status == 409
    with pytest.raises(PoolingConflict):  # the catalog states MiniLM's pooling
        async with models.lease(MINILM_NAME, LoadRequest(pooling="cls")):
            pass
    await models.drain(5)


async def test_a_max_seq_len_other_than_the_models_fixed_one_is_refused(minilm_dir: Path) -> None:
    from embedx.errors import InvalidOption

    models = registry()
    with pytest.raises(InvalidOption, match="reads 256 tokens"):  # the catalog entry's
        async with models.lease(MINILM_NAME, LoadRequest(max_seq_len=128)):
            pass
    async with models.lease(MINILM_NAME, LoadRequest(max_seq_len=256)):
        pass
    path = str(minilm_dir)  # no catalog entry: its first load fixes it (at 256, its own)
    async with models.lease(path, LoadRequest(pooling="mean")):
        pass
    with pytest.raises(InvalidOption, match="reads 256 tokens"):
        async with models.lease(path, LoadRequest(max_seq_len=512)):
            pass
    await models.drain(5)


async def test_a_directory_is_one_model_however_its_path_is_spelled(minilm_dir: Path) -> None:
    models = registry()
    for spelling in (str(minilm_dir), f"{minilm_dir}/", f"{minilm_dir}/./", f"/{minilm_dir}"):
        async with models.lease(spelling, LoadRequest(pooling="mean")):
            pass
    canonical = minilm_dir.resolve()  # noqa: ASYNC240 (a test's one stat)
    assert [(r.spec.name, r.spec.source) for r in models.residents()] == [
        (local_name(canonical), str(canonical))
    ]
    assert str(canonical) not in local_name(canonical)
    await models.drain(5)


async def test_without_local_paths_a_name_is_never_looked_for_on_disk(
    minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repo id is also a relative path: `org/model` in the working directory is not
    served in its place, and a path gets the same 404 whether or not it exists."""
    (tmp_path / "embedx-tests").mkdir()
    (tmp_path / "embedx-tests" / "m").symlink_to(minilm_dir)
    monkeypatch.chdir(tmp_path)
    models = registry(local_paths=False)
    messages = []
    for name in ("embedx-tests/m", str(minilm_dir), str(tmp_path / "missing")):
        with pytest.raises(ModelNotFound) as caught:
            async with models.lease(name, LoadRequest(pooling="mean")):
                pass
        messages.append(caught.value.message.replace(repr(name), "NAME"))
    assert "offline" in messages[0]  # looked for in the Hugging Face cache only
    assert messages[1] == messages[2]
    assert "EMBEDX_ALLOW_LOCAL_PATHS" in messages[1]
    assert models.residents() == []
    library = registry()  # the library's caller is the operator: its names may be paths
    async with library.lease("embedx-tests/m", LoadRequest(pooling="mean")):
        pass
    await library.drain(5)


async def test_a_pooling_other_than_the_one_its_files_state_is_served_with_a_warning(
    minilm_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    models = registry()
    async with models.lease(str(minilm_dir), LoadRequest(pooling="mean")):
        pass
    assert "Pooling module states" not in caplog.text
    await models.drain(5)
    models = registry()
    async with models.lease(str(minilm_dir), LoadRequest(pooling="cls")):
        pass  # stated by the request, so served: but not silently
    assert "pools with cls as asked, but its sentence-transformers Pooling module states mean" in (
        caplog.text
    )
    await models.drain(5)


async def test_catalog_only_refuses_other_names(minilm_dir: Path) -> None:
    models = registry(catalog_only="true")
    with pytest.raises(ModelNotFound) as caught:
        async with models.lease(str(minilm_dir), LoadRequest(pooling="mean")):
            pass
    assert caught.value.status == 404


async def test_keep_alive_zero_unloads_when_the_last_user_leaves_and_frees_memory(
    minilm_dir: Path,
) -> None:
    models = registry()
    async with models.lease(str(minilm_dir), LoadRequest(pooling="mean", keep_alive_s=0)) as engine:
        weights = weakref.ref(engine.engine.replicas[0].model.encoder.word)  # type: ignore[attr-defined]
        await engine.embed(["held"])
    assert models.residents() == []
    del engine

    def freed() -> bool:  # the unload runs in the background
        gc.collect()
        return weights() is None

    await eventually_async(freed, message="the weights are still referenced after eviction")


async def test_an_idle_model_is_freed_while_another_keeps_the_heap_frozen(
    tiny_models: dict[str, Path],
) -> None:
    heap.manage()  # as `embedx serve` does
    models = registry(tiny_models)
    async with models.lease("bert-base"):  # stays, for the default keep-alive
        pass
    async with models.lease("bert-large", LoadRequest(keep_alive_s=0)) as engine:
        weights = weakref.ref(engine.engine.replicas[0].model.encoder.word)  # type: ignore[attr-defined]
    del engine

    def freed() -> bool:  # the unload runs in the background
        gc.collect()
        return weights() is None

    await eventually_async(freed, message="the unloaded model's weights are still referenced")
    # the unload's end freezes the heap again
    await eventually_async(gc.get_freeze_count, message="the heap was left thawed after an unload")
    assert [r.spec.name for r in models.residents()] == ["bert-base"]
    await models.drain(5)
    heap.manage(False)


async def test_an_idle_model_unloads_after_its_keep_alive(minilm_dir: Path) -> None:
    models = registry()
    async with models.lease(str(minilm_dir), LoadRequest(pooling="mean", keep_alive_s=0.3)):
        pass
    assert len(models.residents()) == 1
    await eventually_async(lambda: models.residents() == [], message="never idled out")


async def test_a_model_whose_every_request_left_during_its_load_still_idles_out(
    minilm_dir: Path,
) -> None:
    models = registry()
    request = LoadRequest(pooling="mean", keep_alive_s=0.2)

    async def gives_up() -> None:  # a client that disconnects during the cold load
        async with models.lease(str(minilm_dir), request):
            raise AssertionError("cancelled before the load finished")

    waiting = asyncio.create_task(gives_up())
    await eventually_async(lambda: models._models)  # its load has begun
    (resident,) = models._models.values()
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert resident.task is not None
    await resident.task  # the load goes on for the next request
    await eventually_async(
        lambda: not models.residents(), message="loaded, unused, and never unloaded"
    )
    await models.drain(5)


async def test_a_model_asked_for_as_it_unloads_loads_once_its_memory_is_free(
    minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    close, load = Engine.close, Engine.load

    emptied = asyncio.Event()

    async def slow_close(self: Engine, error: BaseException | None = None) -> None:
        await emptied.wait()  # a GPU's cache takes a while to empty: until the test says
        await close(self, error)
        events.append("closed")

    async def recorded_load(*args: Any) -> Engine:
        events.append("loading")
        return await load(*args)

    monkeypatch.setattr(Engine, "close", slow_close)
    monkeypatch.setattr(Engine, "load", recorded_load)
    models = registry()
    request = LoadRequest(pooling="mean", keep_alive_s=0)

    async def use() -> None:
        async with models.lease(str(minilm_dir), request):
            pass

    await use()  # unloaded as it ends, its memory not yet free
    again = asyncio.create_task(use())  # asked for again at once
    await eventually_async(lambda: models._models)  # its load has begun, and waits
    emptied.set()
    await again
    await models.drain(5)
    assert events[:3] == ["loading", "closed", "loading"]


async def test_the_residency_cap_evicts_the_least_recently_used_idle_model(
    tiny_models: dict[str, Path],
) -> None:
    models = registry(tiny_models, max_loaded_models=2)
    for name in ("bert-base", "bert-large"):
        async with models.lease(name):
            pass
    async with models.lease("bert-base"):  # now bert-large is the least recently used
        pass
    async with models.lease("qwen3-0.6b"):
        names = {r.spec.name for r in models.residents()}
    assert names == {"bert-base", "qwen3-0.6b"}
    await models.drain(5)


async def test_preloaded_models_stay_loaded_unless_their_entry_says_otherwise(
    tiny_models: dict[str, Path],
) -> None:
    models = registry(tiny_models, max_loaded_models=2, default_keep_alive_s=0.2)
    models.catalog["qwen3-0.6b"] = models.catalog["qwen3-0.6b"].with_overrides(keep_alive_s=0.2)
    await models.preload(["bert-base", "qwen3-0.6b"])
    # qwen3's entry sets its keep-alive: it idles out; bert-base, idle as long, would have too
    await eventually_async(lambda: [r.spec.name for r in models.residents()] == ["bert-base"])
    assert models.degraded() == []  # as asked: /health stays ok
    for name in ("bert-large", "qwen3-0.6b"):  # the cap is 2: never by evicting bert-base
        async with models.lease(name):
            pass
    assert "bert-base" in {r.spec.name for r in models.residents()}
    async with models.lease("bert-base"), models.lease("bert-large"):
        with pytest.raises(ModelsBusy):  # pinned and in use: no room for a third
            await models.lease("qwen3-0.6b").__aenter__()
    assert models.describe()[0]["keep_alive_s"] is None
    await models.drain(5)
    models = registry(tiny_models, max_loaded_models=2)
    await models.preload(["bert-base", "bert-large"])
    with pytest.raises(ModelsBusy) as caught:  # every resident pinned: no retry will help
        await models.lease("qwen3-0.6b").__aenter__()
    assert caught.value.headers() == {"x-should-retry": "false"}  # the OpenAI SDK's
    await models.drain(5)


async def test_a_preloaded_model_reloaded_after_a_fault_stays_whatever_its_reloader_asks(
    tiny_models: dict[str, Path],
) -> None:
    models = registry(tiny_models)
    await models.preload(["bert-base"])
    async with models.lease("bert-base") as engine:
        for slot in engine.engine.queue.devices:  # every device of it fails under this request
            engine.engine.queue.quarantine(slot, "failed (injected)")
    # unloaded as the request left, and loading again at once: the server keeps it
    assert [r.engine for r in models.residents() if r.spec.name == "bert-base"] == [None]
    async with models.lease("bert-base", LoadRequest(keep_alive_s=0)):  # joins that load
        pass
    assert [r.spec.name for r in models.residents()] == ["bert-base"], "unloaded: keep_alive 0"
    assert models.describe()[0]["keep_alive_s"] is None  # for good, as preloaded
    await models.drain(5)


async def test_the_cap_holds_under_concurrent_cold_loads_and_busy_models_are_kept(
    tiny_models: dict[str, Path],
) -> None:
    models = registry(tiny_models, max_loaded_models=2)
    peak = holding = 0
    gate = asyncio.Event()
    refusals: list[ModelsBusy] = []

    async def hold(name: str) -> str:
        nonlocal peak, holding
        try:
            async with models.lease(name):
                peak = max(peak, len(models.residents()))
                holding += 1
                await gate.wait()
                return "served"
        except ModelsBusy as exc:
            refusals.append(exc)
            return "busy"

    tasks = [asyncio.create_task(hold(n)) for n in tiny_models]
    await eventually_async(lambda: holding + len(refusals) == len(tasks))  # each served or not
    gate.set()
    outcomes = await asyncio.gather(*tasks)
    assert peak <= 2
    assert all(r.status == 503 and r.headers()["Retry-After"] for r in refusals)
    assert outcomes.count("served") == 2
    assert outcomes.count("busy") == len(tiny_models) - 2
    await models.drain(5)


async def test_loads_are_limited_by_max_concurrent_loads(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedx import engine as engine_module

    models = registry(tiny_models, max_concurrent_loads=1)
    running = 0
    most = 0
    original = engine_module.Engine.load.__func__  # type: ignore[attr-defined]

    async def counted(cls: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            return await original(cls, *args, **kwargs)
        finally:
            running -= 1

    monkeypatch.setattr(engine_module.Engine, "load", classmethod(counted))

    async def use(name: str) -> None:
        async with models.lease(name):
            pass

    await asyncio.gather(*(use(n) for n in ("bert-base", "bert-large", "qwen3-0.6b")))
    assert most == 1
    await models.drain(5)


async def test_a_failed_load_leaves_nothing_resident(tmp_path: Path) -> None:
    models = registry()
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(Exception, match="pickle"):
        async with models.lease(str(tmp_path), LoadRequest(pooling="mean")):
            pass
    assert models.residents() == []


async def test_describe_lists_what_info_shows(minilm_dir: Path) -> None:
    models = registry()
    async with models.lease(str(minilm_dir), LoadRequest(pooling="mean")) as engine:
        await engine.embed(["word " * 300])
        entry = models.describe()[0]
    for key in ("pooling", "dimensions", "max_seq_len", "devices", "idle_s", "truncated_inputs"):
        assert key in entry
    assert entry["truncated_inputs"] == 1
    assert entry["devices"][0]["dtype"] == "float32"
    await models.drain(5)


@pytest.mark.process
def test_registry_module_imports_without_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, embedx, embedx.config, embedx.scheduling, embedx.errors,"
        " embedx.registry;"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_a_request_waiting_for_a_load_when_the_server_drains_is_told_so(
    minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedx import engine as engine_module
    from embedx.errors import ShuttingDown

    loading = asyncio.Event()

    async def endless(cls: Any, *args: Any, **kwargs: Any) -> Any:
        loading.set()
        await asyncio.Event().wait()  # until cancelled

    monkeypatch.setattr(engine_module.Engine, "load", classmethod(endless))
    models = registry()

    async def use() -> None:
        async with models.lease(str(minilm_dir), LoadRequest(pooling="mean")):
            pass

    waiting = asyncio.create_task(use())
    await until(loading)
    await models.drain(0)
    with pytest.raises(ShuttingDown) as caught:  # a 503, not a cancelled request
        await waiting
    assert caught.value.status == 503


async def test_catalog_only_never_reads_a_requests_name_as_a_path() -> None:
    models = registry(catalog_only="true")
    for name in ("~nouser/x", "a" * 300, "/"):
        with pytest.raises(ModelNotFound, match="EMBEDX_CATALOG_ONLY"):
            async with models.lease(name, LoadRequest(pooling="mean")):
                pass


def test_a_blank_name_names_no_directory() -> None:
    from embedx import Embedder

    with pytest.raises(ModelNotFound, match="not a directory"):  # not the working directory
        Embedder("", pooling="mean")


async def test_a_max_seq_len_sent_while_the_model_loads_is_checked_once_it_has(
    minilm_dir: Path,
) -> None:
    from embedx.errors import InvalidOption

    models = registry()
    path = str(minilm_dir)

    async def use(request: LoadRequest) -> None:
        async with models.lease(path, request):
            pass

    first = asyncio.create_task(use(LoadRequest(pooling="mean")))
    # the load has started; the model's length is not known yet
    await eventually_async(lambda: models._models)
    with pytest.raises(InvalidOption, match="reads 256 tokens"):
        await use(LoadRequest(max_seq_len=16))
    await first
    assert models.residents()[0].users == 0
    await models.drain(5)


async def test_a_model_whose_files_fail_to_load_evicts_no_healthy_model_on_each_retry(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_models["bert-base"], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated
    models = registry(tiny_models, max_loaded_models=2)
    for name in ("bert-base", "bert-large"):
        async with models.lease(name):
            pass
    first = None
    for _ in range(3):
        with pytest.raises(InvalidModel) as caught:
            async with models.lease(str(broken), LoadRequest(pooling="mean")):
                pass
        first = first or caught.value.message
        assert caught.value.message.startswith(first)
    assert "tried again" in caught.value.message
    assert models.evictions == 1  # the first try made room; the retries did not
    assert {r.spec.name for r in models.residents()} == {"bert-large"}
    await models.drain(5)


async def test_a_name_that_leads_nowhere_evicts_no_model_even_with_a_pooling(
    tiny_models: dict[str, Path],
) -> None:
    models = registry(tiny_models, max_loaded_models=1)
    async with models.lease("bert-base"):
        pass
    for _ in range(2):
        with pytest.raises(ModelNotFound):
            async with models.lease("embedx-tests/not-cached", LoadRequest(pooling="mean")):
                pass
    assert models.evictions == 0
    assert [r.spec.name for r in models.residents()] == ["bert-base"]
    await models.drain(5)


async def test_a_failed_load_is_remembered_without_the_tensors_it_had_made(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Its error's traceback holds every tensor the load made: keeping the error would keep
    them (on a GPU, its memory) for as long as the memory lasts."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "wrong-shape"
    shutil.copytree(tiny_models["bert-base"], broken)
    tensors = load_file(broken / "model.safetensors")
    name = next(k for k in tensors if k.endswith("intermediate.dense.weight"))
    tensors[name] = tensors[name][:-1].contiguous()
    save_file(tensors, broken / "model.safetensors")
    del tensors

    def live_tensors() -> int:
        gc.collect()
        with warnings.catch_warnings():  # isinstance wakes torch's deprecated module aliases
            warnings.simplefilter("ignore", FutureWarning)
            return sum(isinstance(o, torch.Tensor) for o in gc.get_objects())

    models = registry()
    counts = []
    for copy in range(3):  # three names, each remembered: the first also warms torch's caches
        directory = shutil.copytree(broken, tmp_path / f"copy-{copy}")
        with pytest.raises(InvalidModel):
            async with models.lease(str(directory), LoadRequest(pooling="mean")):
                pass
        counts.append(live_tensors())
    assert counts[2] <= counts[1] <= counts[0], counts


async def test_a_bug_in_a_load_is_not_answered_from_memory(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Remembered, it came back as a TypeError (Bug takes no param) in place of the bug."""
    from embedx.engine import Engine
    from embedx.errors import Bug

    async def broken(*args: Any) -> Engine:
        raise Bug("an invariant broke (injected)")

    monkeypatch.setattr(Engine, "load", broken)
    models = registry(tiny_models)
    for _ in range(2):
        with pytest.raises(Bug, match="injected"):
            async with models.lease("bert-base"):
                pass


async def test_a_name_the_hub_could_not_be_asked_about_says_so_beside_asking_for_pooling(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    models = registry()
    with pytest.raises(PoolingRequired) as caught:
        await models.lease("sentence-transformers/all-MiniLM-L6-v3").__aenter__()
    assert "hub could not be reached to check that it exists" in caught.value.message
    assert caught.value.message.endswith(f"did you mean {MINILM_NAME!r}?")


def _device_holds(models: ModelRegistry, count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one device fits `count` models: a load beside that many finds no room."""
    from embedx.errors import NoDeviceFits

    load = Engine.load

    async def limited(spec: ModelSpec, *args: Any) -> Engine:
        if sum(r.engine is not None for r in models._models.values()) >= count:
            raise NoDeviceFits(f"model {spec.name!r} fits on no device (injected)")
        return await load(spec, *args)

    monkeypatch.setattr(Engine, "load", limited)


async def test_a_model_that_fits_nowhere_unloads_idle_models_until_it_does(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedx.errors import NoDeviceFits

    models = registry(tiny_models, max_loaded_models=3)
    _device_holds(models, 1, monkeypatch)
    async with models.lease("bert-base"):
        with pytest.raises(NoDeviceFits):  # in use: not unloaded to make room
            await models.lease("bert-large").__aenter__()
    async with models.lease("bert-large") as engine:  # bert-base idle now: it makes room
        assert (await engine.embed(["x"])).vectors.shape[0] == 1
    assert {r.spec.name for r in models.residents()} == {"bert-large"}
    assert models.evictions == 1
    await models.drain(5)


async def test_making_room_unloads_the_least_recently_used_idle_model_first(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:

    models = registry(tiny_models, max_loaded_models=4)
    _device_holds(models, 2, monkeypatch)
    for name in ("bert-base", "bert-large", "bert-base"):  # bert-large is now the older
        async with models.lease(name):
            pass
    async with models.lease("xlm-roberta-large"):
        pass
    assert {r.spec.name for r in models.residents()} == {"bert-base", "xlm-roberta-large"}
    assert models.evictions == 1
    await models.drain(5)


async def test_a_model_too_large_for_any_device_unloads_nothing(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedx.errors import NoDeviceFits
    from embedx.registry import loading as registry_loading

    models = registry(tiny_models)
    async with models.lease("bert-base"):
        pass
    monkeypatch.setattr(registry_loading, "weight_bytes", lambda *_: 1 << 40)  # 1 TiB
    monkeypatch.setattr(Engine, "load", _no_device_fits)
    with pytest.raises(NoDeviceFits):
        await models.lease("bert-large").__aenter__()
    assert models.evictions == 0  # bert-base stays: unloading it could not have helped
    assert {r.spec.name for r in models.residents()} == {"bert-base"}
    await models.drain(5)


async def _no_device_fits(spec: ModelSpec, *args: Any) -> Engine:
    from embedx.errors import NoDeviceFits

    raise NoDeviceFits(f"model {spec.name!r} fits on no device (injected)")
