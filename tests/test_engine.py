from __future__ import annotations

import asyncio
import gc
import json
import logging
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embedx import heap
from embedx.engine import EmbedOptions, Engine
from embedx.errors import EmptyInput, InputTooLong, InvalidInput, UnsupportedDimensions
from tests.support.corpus import lee50
from tests.support.fakes import Gate, oom, wrap
from tests.support.reference import decoded
from tests.support.waiting import PATIENCE_S, eventually_async, next_turn

pytestmark = pytest.mark.anyio


async def test_one_device_matches_sentence_transformers(
    make_engine: Callable[..., Any], reference_texts: list[str], st_reference: np.ndarray
) -> None:
    assert len(reference_texts) >= 500
    async with make_engine(("cpu",)) as engine:
        result = await engine.embed(reference_texts)
    assert result.vectors.dtype == np.float32
    assert np.abs(result.vectors - st_reference).max() < 1e-5
    assert result.truncated > 0  # some texts are longer than the model's 256 tokens


async def test_split_over_devices_of_different_speed_matches_too(
    make_engine: Callable[..., Any], reference_texts: list[str], st_reference: np.ndarray
) -> None:
    # A quarter of the corpus, every fourth text: a dozen batches to split, a quarter the CPU.
    texts, expected = reference_texts[::4], st_reference[::4]
    async with make_engine(("fast", "medium", "slow"), max_batch_tokens=2048) as engine:
        wrap(engine, "medium", rate=60_000)
        wrap(engine, "slow", rate=15_000)
        before = {w.slot.name: w.slot.tokens_done for w in engine.workers}  # the smoke test
        result = await engine.embed(texts)
        worked = {w.slot.name: w.slot.tokens_done - before[w.slot.name] for w in engine.workers}
    assert np.abs(result.vectors - expected).max() < 1e-5
    assert sum(worked.values()) == result.tokens  # every token ran once, on one device
    assert sum(1 for tokens in worked.values() if tokens) >= 2


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


async def test_lee50_human_similarity_is_reproduced(make_engine: Callable[..., Any]) -> None:
    texts, human = lee50()
    async with make_engine(("cpu",)) as engine:
        vectors = (await engine.embed(texts)).vectors
    cosine = vectors @ vectors.T
    upper = np.triu_indices(len(texts), k=1)
    assert len(upper[0]) == 1225
    # the corpora's README gives 0.656 for this model (mean pooling, normalized, fp32, CPU)
    assert pearson(cosine[upper], human[upper]) == pytest.approx(0.656, abs=0.002)


async def test_requests_running_together_each_get_their_own_rows_in_order(
    make_engine: Callable[..., Any], reference_texts: list[str], st_reference: np.ndarray
) -> None:
    texts, expected = reference_texts[:140], st_reference[:140]  # seven requests of 20
    async with make_engine(("a", "b"), max_batch_tokens=1024) as engine:
        parts = [texts[i::7] for i in range(7)]
        results = await asyncio.gather(*(engine.embed(part) for part in parts))
    for i, result in enumerate(results):
        assert np.abs(result.vectors - expected[i::7]).max() < 1e-5


async def test_matryoshka_dimensions_and_normalize_options(
    make_engine: Callable[..., Any], st_reference: np.ndarray, reference_texts: list[str]
) -> None:
    async with make_engine(("cpu",)) as engine:
        short = await engine.embed(reference_texts[:8], EmbedOptions(dimensions=64))
        raw = await engine.embed(reference_texts[:8], EmbedOptions(normalize=False))
        for wrong in (385, 0, True, 1.5, "64"):  # the library's callers are not JSON-checked
            with pytest.raises(UnsupportedDimensions):
                await engine.embed(reference_texts[:1], EmbedOptions(dimensions=wrong))  # type: ignore[arg-type]
        # at once, so they share batches: one wants unit rows, the other raw ones to cut
        full, cut = await asyncio.gather(
            engine.embed(reference_texts[:40]),
            engine.embed(reference_texts[:40], EmbedOptions(dimensions=64)),
        )
    expected = st_reference[:8, :64]
    expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.abs(short.vectors - expected).max() < 1e-5
    assert np.abs(full.vectors - st_reference[:40]).max() < 1e-5
    expected = st_reference[:40, :64]
    expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.abs(cut.vectors - expected).max() < 1e-5
    # MiniLM has a Normalize module: its vectors are unit length either way
    assert np.allclose(np.linalg.norm(raw.vectors, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    ("texts", "error"),
    [([], EmptyInput), ("a string", InvalidInput), (["ok", 3], InvalidInput), ([""], InvalidInput)],
)
async def test_bad_input_is_a_typed_error(
    make_engine: Callable[..., Any], texts: Any, error: type[Exception]
) -> None:
    async with make_engine(("cpu",)) as engine:
        with pytest.raises(error):
            await engine.embed(texts)
        assert (await engine.embed(["still serving"])).vectors.shape == (1, 384)


async def test_an_over_long_text_with_truncation_off_is_refused_and_nothing_is_queued(
    make_engine: Callable[..., Any],
) -> None:
    async with make_engine(("cpu",)) as engine:
        with pytest.raises(InputTooLong, match="input 0 "):
            await engine.embed(["word " * 400], EmbedOptions(truncate=False))
        assert engine.queue.pending_items == 0
        # long enough to be cut at a space before tokenizing: refused the same way
        assert len("word " * 2000) > engine.tokenizer.windows.cut_at
        with pytest.raises(InputTooLong, match="input 1 "):
            await engine.embed(["short", "word " * 2000], EmbedOptions(truncate=False))
        assert engine.queue.pending_items == 0
        # past the first tokenizer call: its place in the whole list, and the texts of the
        # calls before it leave the queue with the request
        texts = ["short text"] * 6000
        texts[5000] = "word " * 400
        with pytest.raises(InputTooLong, match="input 5000 "):
            await engine.embed(texts, EmbedOptions(truncate=False))
        assert engine.queue.pending_items == 0
        assert (await engine.embed(["still serving"])).vectors.shape == (1, 384)


async def test_a_cancelled_request_frees_its_items(
    make_engine: Callable[..., Any], reference_texts: list[str]
) -> None:
    async with make_engine(("cpu",), max_batch_tokens=256) as engine:
        wrap(engine, "cpu", rate=20_000)
        task = asyncio.create_task(engine.embed(reference_texts))
        await eventually_async(lambda: engine.queue.pending_items)  # its texts are queued
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.queue.pending_items == 0
        assert engine.queue.pending_tokens == 0
        again = await engine.embed(reference_texts[:3])
    assert again.vectors.shape == (3, 384)


async def test_a_cancelled_requests_items_and_token_ids_leave_the_queue(
    make_engine: Callable[..., Any], reference_texts: list[str]
) -> None:
    async with make_engine(("cpu",), max_batch_tokens=256) as engine:
        gate = Gate()  # the device holds its first batch: no claim sweeps the buckets
        wrap(engine, "cpu", gate=gate)
        task = asyncio.create_task(engine.embed(reference_texts * 4))
        await eventually_async(lambda: engine.queue.pending_items >= 1000)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert engine.queue.pending_items == 0
        assert not list(engine.queue._pending.items())  # nor keeps their ids for keep_alive
        gate.open()


async def test_closing_as_a_batch_finishes_ends_the_workers(
    make_engine: Callable[..., Any],
) -> None:
    async with make_engine(("cpu",), smoke_test=False) as engine:
        loop = asyncio.get_running_loop()
        replica = engine.replicas[0]
        forward, launch = replica.model.forward, replica.accelerator.launch
        launches: list[Any] = []
        closing: list[asyncio.Future[None]] = []

        def recorded_launch(work: Callable[[], Any]) -> Any:
            launches.append(launch(work))
            return launches[-1]

        def forward_then_close(batch: Any) -> Any:
            out = forward(batch)
            if not closing:
                closing.append(loop.create_future())
                # The loop held busy while the batch finishes and a close is asked for: both
                # run in one turn, the batch's result landing on a cancelled worker.
                stalled, posted = threading.Event(), threading.Event()

                def stall() -> None:  # until the batch's result is posted to the loop
                    launches[-1].future.add_done_callback(lambda _: posted.set())
                    stalled.set()
                    posted.wait(PATIENCE_S)

                loop.call_soon_threadsafe(stall)
                stalled.wait(PATIENCE_S)
                loop.call_soon_threadsafe(
                    lambda: closing.append(asyncio.ensure_future(engine.close()))
                )
            return out

        replica.model.forward = forward_then_close
        replica.accelerator.launch = recorded_launch
        embedding = asyncio.ensure_future(engine.embed(["one text"]))
        await eventually_async(lambda: len(closing) == 2)
        await asyncio.gather(embedding, return_exceptions=True)
        # 3.11's wait_for kept the worker: for ever
        await asyncio.wait_for(closing[1], PATIENCE_S)
        assert all(task.done() for task in engine._tasks)


async def test_a_device_out_of_memory_empties_its_cache_once_its_replica_is_gone(
    make_engine: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import weakref

    from embedx.devices import CpuAccelerator
    from embedx.engine import loading
    from embedx.engine import probe as probing

    probe = probing.probe
    models: list[weakref.ref[Any]] = []
    alive_when_emptied: list[bool] = []

    async def out_of_memory_on_short(replica: Any, plan: Any) -> Any:
        if replica.accelerator.info.key != "short":
            return await probe(replica, plan)
        models.append(weakref.ref(replica.model))
        # no future of the thread that built it holds it still: nothing could free it then
        held_by = gc.get_referrers(replica.model)
        assert not any(isinstance(r, Future | asyncio.Future) for r in held_by)
        raise oom("CUDA out of memory (injected, in a probe batch)")

    def emptied(self: CpuAccelerator) -> None:  # where CudaAccelerator empties its cache
        alive_when_emptied.append(models[-1]() is not None)

    monkeypatch.setattr(loading, "probe", out_of_memory_on_short)
    monkeypatch.setattr(CpuAccelerator, "release_cached_memory", emptied)
    async with make_engine(("good", "short"), smoke_test=False) as engine:
        assert "short" in str(engine.skipped)
        # the error's traceback held the replica until its `except` ended
        assert alive_when_emptied == [False]


async def test_the_smoke_test_is_not_counted_as_a_request(
    make_engine: Callable[..., Any],
) -> None:
    async with make_engine(("cpu",)) as engine:
        assert engine.describe()["requests"] == 0
        await engine.embed(["one"])
        assert engine.describe()["requests"] == 1
        assert engine.latency.count == 1


async def test_oom_on_a_batch_splits_it_and_the_request_succeeds(
    make_engine: Callable[..., Any], reference_texts: list[str], st_reference: np.ndarray
) -> None:
    texts, expected = reference_texts[:100], st_reference[:100]  # a few batches of 4096 tokens
    async with make_engine(("cpu",), max_batch_tokens=4096) as engine:
        wrapper = wrap(
            engine, "cpu", fail=lambda b, _: oom() if b.input_ids.shape[0] > 600 else None
        )
        result = await engine.embed(texts)
        slot = engine.workers[0].slot
        assert slot.budget <= 1024
        assert slot.active
    assert np.abs(result.vectors - expected).max() < 1e-5
    assert wrapper.calls > 1


async def test_a_device_failing_every_batch_is_quarantined_and_the_others_finish(
    make_engine: Callable[..., Any], reference_texts: list[str], st_reference: np.ndarray
) -> None:
    texts, expected = reference_texts[::4], st_reference[::4]  # a dozen batches of 2048 tokens
    async with make_engine(("good", "bad"), max_batch_tokens=2048) as engine:
        wrap(engine, "bad", fail=lambda b, n: RuntimeError("device lost (injected)"))
        result = await engine.embed(texts)
        bad = next(w.slot for w in engine.workers if w.slot.name == "bad")
        described = engine.describe()
    assert np.abs(result.vectors - expected).max() < 1e-5
    assert not bad.active
    assert "injected" in (bad.reason or "")
    assert any(d["device"] == "bad" and d["state"] == "quarantined" for d in described["devices"])


async def test_a_hanging_device_is_quarantined_and_its_items_finished_elsewhere(
    make_engine: Callable[..., Any], reference_texts: list[str], st_reference: np.ndarray
) -> None:
    # A hang is 20 times a batch's expected time, and at least batch_timeout_s: 5 s, which a
    # batch of 256 tokens passes on no machine however busy, and a batch held at a gate does.
    async with make_engine(("good", "hangs"), max_batch_tokens=256, batch_timeout_s=5) as engine:
        held = Gate()
        hang = wrap(engine, "hangs", gate=held)
        result = await engine.embed(reference_texts[:200])
        slot = next(w.slot for w in engine.workers if w.slot.name == "hangs")
        held.open()  # its thread ends
    assert np.abs(result.vectors - st_reference[:200]).max() < 1e-5
    assert not slot.active
    assert "ran past" in (slot.reason or "")
    assert hang.calls >= 1


async def test_when_every_device_fails_the_request_gets_an_error_not_a_hang(
    make_engine: Callable[..., Any],
) -> None:
    from embedx.errors import NoDeviceAvailable

    async with make_engine(("only",)) as engine:
        wrap(engine, "only", fail=lambda b, n: RuntimeError("broken (injected)"))
        with pytest.raises(NoDeviceAvailable):
            await engine.embed(["a", "b", "c"])


async def test_a_batch_whose_rows_fail_to_be_written_runs_again_and_the_worker_lives_on(
    make_engine: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    reference_texts: list[str],
    st_reference: np.ndarray,
) -> None:
    from embedx.engine import worker as worker_module
    from embedx.engine.outputs import write_batch as write

    failures = 0

    def fails_once(*args: Any) -> None:
        nonlocal failures
        if not failures:
            failures += 1
            raise MemoryError("no room for the rows (injected)")
        write(*args)

    async with make_engine(("cpu",)) as engine:
        monkeypatch.setattr(worker_module, "write_batch", fails_once)
        # before, the worker's task died with the error and the request waited forever
        result = await asyncio.wait_for(engine.embed(reference_texts[:50]), 60)
        again = await asyncio.wait_for(engine.embed(reference_texts[50:60]), 60)
        assert engine.workers[0].slot.active
    assert failures == 1
    assert np.abs(result.vectors - st_reference[:50]).max() < 1e-5
    assert np.abs(again.vectors - st_reference[50:60]).max() < 1e-5


async def test_a_worker_that_dies_of_a_bug_hands_its_work_on_rather_than_leaving_it_waiting(
    make_engine: Callable[..., Any],
    reference_texts: list[str],
    st_reference: np.ndarray,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from embedx.errors import NoDeviceAvailable

    def breaks_for(engine: Engine, victims: set[str]) -> None:
        claim = engine.queue.claim

        def claim_or_die(device: Any) -> Any:
            if device.name in victims:
                raise TypeError("a bug in the worker's own code (injected)")
            return claim(device)

        engine.queue.claim = claim_or_die  # type: ignore[method-assign]

    async with make_engine(("good", "bad"), max_batch_tokens=2048) as engine:
        breaks_for(engine, {"bad"})
        result = await asyncio.wait_for(engine.embed(reference_texts[:100]), 60)
        bad = next(w.slot for w in engine.workers if w.slot.name == "bad")
    assert np.abs(result.vectors - st_reference[:100]).max() < 1e-5
    assert not bad.active
    assert "injected" in (bad.reason or "")
    assert "the worker of bad failed" in caplog.text

    async with make_engine(("only",)) as engine:
        breaks_for(engine, {"only"})
        with pytest.raises(NoDeviceAvailable, match="its worker failed"):
            await asyncio.wait_for(engine.embed(["a", "b", "c"]), 60)


async def test_a_request_that_fails_stops_tokenizing_its_other_texts(
    make_engine: Callable[..., Any], reference_texts: list[str]
) -> None:
    from embedx.errors import EmbeddingFailed
    from embedx.models.chunks import CHUNK, FIRST_CHUNK, chunk_bounds

    poison = "zyzzyva"  # one of its tokens is in no reference text
    texts = [poison, *(reference_texts * 40)][: FIRST_CHUNK + 4 * CHUNK]
    bounds = list(chunk_bounds(map(len, texts)))
    assert len(bounds) >= 5
    # Texts cut to 8 tokens: the first chunk is a few batches, so its poisoned batch runs soon
    # whichever end the device takes, however busy the machine.
    async with make_engine(("cpu",), max_batch_tokens=4096, max_seq_len=8) as engine:
        poison_id = int(engine.tokenizer.encode_now([poison]).ids[3])
        assert poison_id not in engine.tokenizer.encode_now(reference_texts).ids
        failed = threading.Event()

        def fail(batch: Any, call: int) -> BaseException | None:
            if not bool((batch.input_ids == poison_id).any()):
                return None
            failed.set()
            return RuntimeError("this text breaks the model (injected)")

        wrap(engine, "cpu", fail=fail)
        engine.queue.max_item_attempts = 1  # its first failed batch fails the request
        tokenizer = engine.tokenizer
        encode = tokenizer._encode
        calls = 0

        def held(batch: list[str]) -> Any:
            nonlocal calls
            calls += 1
            if calls > 1:  # the first chunk's call runs; the next waits for the failure
                failed.wait()  # set by the first chunk's batches (pytest-timeout bounds a bug)
            return encode(batch)

        tokenizer._encode = held
        before = tokenizer.texts
        with pytest.raises(EmbeddingFailed, match="breaks the model"):
            await engine.embed(texts)
        # the first chunk, the two queued behind it, and at most the one queued as the
        # second arrived: never the fifth
        assert tokenizer.texts - before <= bounds[3][1]
        assert (await engine.embed(reference_texts[:3])).vectors.shape == (3, 384)


async def test_a_failed_smoke_test_leaves_nothing_loaded(
    make_engine: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedx.errors import SmokeTestFailed
    from embedx.models import loader

    closed: list[Engine] = []
    original_close = Engine.close

    async def spy_close(self: Engine) -> None:
        closed.append(self)
        await original_close(self)

    monkeypatch.setattr(Engine, "close", spy_close)
    monkeypatch.setattr(
        loader.EmbeddingModel,
        "forward",
        lambda self, batch: torch.full((batch.count, 384), float("nan")),
    )
    with pytest.raises(SmokeTestFailed):
        async with make_engine(("cpu",)):
            pass
    assert closed
    assert closed[0].state.value == "closed"
    assert not closed[0].replicas


async def test_a_cpu_replica_that_needs_more_than_the_hosts_free_memory_is_not_loaded(
    make_engine: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedx import devices
    from embedx.errors import NoDeviceFits

    monkeypatch.setattr(devices, "_cpu_memory", lambda: (1 << 20, 1 << 34))
    with pytest.raises(NoDeviceFits, match=r"cpu: needs \d+ MiB, 1 MiB free"):
        async with make_engine(("cpu",)):
            pass


async def test_a_template_wraps_every_input(
    make_engine: Callable[..., Any], sentence_transformer: Any
) -> None:
    async with make_engine(("cpu",), wrapping="query: {text}") as engine:
        ours = (await engine.embed(["what is a fox?"])).vectors
    expected = sentence_transformer.encode(["query: what is a fox?"])
    assert np.abs(ours - expected).max() < 1e-5


async def test_a_model_that_pools_without_its_prompt_is_said_to_differ_when_wrapped(
    make_engine: Callable[..., Any],
    minilm_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    directory = tmp_path / "no-prompt-pooling"
    shutil.copytree(minilm_dir, directory)
    pooling = directory / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({**json.loads(pooling.read_text()), "include_prompt": False}))
    with caplog.at_level(logging.WARNING, logger="embedx.engine"):
        async with make_engine(("cpu",), model_dir=directory, wrapping="query: {text}"):
            pass
    assert "leaves a prompt's tokens out of the mean" in caplog.text


def test_engine_module_has_no_http(tmp_path: Path) -> None:
    import embedx.engine as engine_module

    source = Path(engine_module.__file__).read_text()
    assert "blacksheep" not in source
    assert "granian" not in source


async def test_base64_rows_are_the_float_rows_encoded(
    make_engine: Callable[..., Any], reference_texts: list[str]
) -> None:
    texts = reference_texts[:30]
    async with make_engine(("cpu",)) as engine:
        floats = (await engine.embed(texts)).vectors
        encoded = (await engine.embed(texts, EmbedOptions(encodings=("base64",)))).vectors
        narrow = await engine.embed(texts, EmbedOptions(encodings=("base64",), dimensions=64))
        narrow_floats = (await engine.embed(texts, EmbedOptions(dimensions=64))).vectors
    assert encoded.dtype == np.uint8
    assert encoded.shape == (30, 2048)  # 384 float32: 1,536 bytes
    assert np.array_equal(decoded(encoded), floats)
    assert np.array_equal(decoded(narrow.vectors), narrow_floats)


async def test_base64_rows_are_written_into_the_callers_array(
    make_engine: Callable[..., Any], reference_texts: list[str]
) -> None:
    texts = reference_texts[:30]
    made: list[np.ndarray] = []

    def into(count: int, width: int) -> np.ndarray:
        lines = np.zeros((count, width + 2), np.uint8)  # a column of a wider array
        made.append(lines)
        return lines[:, 1:-1]

    async with make_engine(("cpu",)) as engine:
        floats = (await engine.embed(texts)).vectors
        full = await engine.embed(texts, EmbedOptions(encodings=("base64",), sink=into))
        narrow = await engine.embed(
            texts, EmbedOptions(encodings=("base64",), dimensions=64, sink=into)
        )
        narrow_floats = (await engine.embed(texts, EmbedOptions(dimensions=64))).vectors
    assert [lines.shape for lines in made] == [(30, 2050), (30, 346)]
    assert np.array_equal(decoded(made[0][:, 1:-1]), floats)
    assert np.array_equal(decoded(made[1][:, 1:-1]), narrow_floats)
    assert np.shares_memory(full.vectors, made[0])
    assert np.shares_memory(narrow.vectors, made[1])
    assert not made[0][:, [0, -1]].any(), "written outside the column it was given"


async def test_a_request_cancelled_while_its_texts_share_a_batch_leaves_the_others_whole(
    make_engine: Callable[..., Any], tiny_models: dict[str, Path], reference_texts: list[str]
) -> None:
    """Its client left while the batch ran: the batch's other rows are delivered, and the
    gone request's rows are not written anywhere (nor counted as the device failing)."""
    texts = reference_texts[:40]
    async with make_engine(("cpu",), model_dir=tiny_models["bert-base"], max_seq_len=64) as engine:
        alone = (await engine.embed(texts)).vectors
        slot = engine.queue.devices[0]
        gate = Gate()  # each batch runs when the test lets it
        device = wrap(engine, "cpu", gate=gate)
        busy = asyncio.create_task(engine.embed(["keeps the device busy"]))
        await eventually_async(lambda: device.calls)  # held at the gate
        leaving = asyncio.create_task(engine.embed(reference_texts[40:80]))
        staying = asyncio.create_task(engine.embed(texts))
        await eventually_async(lambda: engine.queue.pending_items == 80)  # both queued

        def shared() -> bool:
            return any(len({id(i.job) for i in c.items}) >= 2 for c in slot.inflight)

        def ran_after(calls: int) -> Callable[[], bool]:
            return lambda: device.calls > calls or staying.done()

        while not shared():  # a batch at a time, until one holds texts of both
            assert not staying.done(), "the two requests never shared a batch"
            next_batch = ran_after(device.calls)
            gate.step()
            await eventually_async(next_batch)
        leaving.cancel()  # as that batch runs
        gate.open()
        result = await staying
        await busy
        assert np.allclose(result.vectors, alone, atol=1e-5)
        assert slot.active
        assert False not in slot.outcomes, "a batch failed"


async def test_texts_cut_to_the_model_length_are_counted_over_every_chunk(
    make_engine: Callable[..., Any], tiny_models: dict[str, Path]
) -> None:
    from embedx.models.chunks import FIRST_CHUNK

    long, short = "many words in a long text " * 20, "short"
    texts = [long if i % 3 == 0 else short for i in range(FIRST_CHUNK + 500)]  # several chunks
    async with make_engine(("cpu",), model_dir=tiny_models["bert-base"], max_seq_len=32) as engine:
        result = await engine.embed(texts)
        assert result.truncated == texts.count(long)
        assert engine.truncated == texts.count(long)  # /info's and /metrics' count


async def test_requests_sharing_a_batch_each_get_the_rows_they_asked_for(
    make_engine: Callable[..., Any], tiny_models: dict[str, Path], reference_texts: list[str]
) -> None:
    texts = reference_texts[:40]
    async with make_engine(("cpu",), model_dir=tiny_models["bert-base"], max_seq_len=64) as engine:
        alone = (await engine.embed(texts, EmbedOptions(normalize=False))).vectors
        # the requests queue while a first, slow batch runs, so they share the next ones
        gate = Gate()
        device = wrap(engine, "cpu", gate=gate)
        busy = asyncio.create_task(engine.embed(["keeps the device busy"]))
        await eventually_async(lambda: device.calls)  # held at the gate
        forms = [(unit, b64) for unit in (True, False) for b64 in (True, False)]
        options = [
            EmbedOptions(normalize=u, encodings=("base64",) if b else ("float",)) for u, b in forms
        ]
        requests = [asyncio.create_task(engine.embed(texts, o)) for o in options]
        await eventually_async(lambda: engine.queue.pending_items == len(forms) * len(texts))
        gate.open()
        results = await asyncio.gather(*requests)
        await busy
    assert not np.allclose(np.linalg.norm(alone, axis=1), 1.0)  # this model has no Normalize
    unit = alone / np.linalg.norm(alone, axis=1, keepdims=True)
    for (normalized, b64), result in zip(forms, results, strict=True):
        vectors = decoded(result.vectors) if b64 else result.vectors
        assert np.allclose(vectors, unit if normalized else alone, atol=1e-5)


async def test_draining_an_idle_model_at_once_warns_of_nothing(
    make_engine: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    async with make_engine(("cpu",)) as engine:
        with caplog.at_level(logging.WARNING, logger="embedx.engine"):
            await engine.drain(0)  # EMBEDX_DRAIN_TIMEOUT_S=0, or a stop before the port opened
    assert "did not finish" not in caplog.text


async def test_a_loaded_model_leaves_the_collectors_scans_until_it_closes(
    make_engine: Callable[..., Any],
) -> None:
    threshold = gc.get_threshold()
    raised = (heap.YOUNG_OBJECTS, *threshold[1:])
    heap.manage()  # as `embedx serve` does
    async with make_engine(("cpu",)) as engine, make_engine(("cpu",)) as other:
        assert gc.get_freeze_count() > 0, "the heap is scanned in full on every collection"
        assert gc.get_threshold() == raised
        await engine.close()
        assert gc.get_freeze_count() == 0, "a closed model's cycles would never be collected"
        assert gc.get_threshold() == raised, "the other model's collections came back"
        await engine.close()  # again: counted once
        assert gc.get_threshold() == raised
        await other.close()
        assert gc.get_threshold() == threshold
    heap.manage(False)


def test_a_failed_launch_leaves_the_slot_of_a_batch_still_running_alone() -> None:
    """Two batches in flight share two pinned slots in turn (a GPU's staging): a launch that
    fails must not move the turn on, or the next batch's rows land in the slot the running
    batch's rows are still being copied into and read from."""
    from types import SimpleNamespace

    from embedx.engine.outputs import FLOATS
    from embedx.engine.worker import DeviceWorker

    slots: list[int] = []

    def pack(ids: object, slot: int, budget: int) -> object:
        slots.append(slot)
        if len(slots) == 2:
            raise RuntimeError("launch failed (injected)")
        return SimpleNamespace(rows=1, tokens=1, graph=None)

    accelerator = SimpleNamespace(
        max_inflight=2,
        launch=lambda work: "launched",
        synchronize=lambda: None,
        is_out_of_memory=lambda error: False,
    )
    worker = DeviceWorker.__new__(DeviceWorker)
    worker.replica = SimpleNamespace(accelerator=accelerator, pack=pack)  # type: ignore[assignment]
    worker.slot = SimpleNamespace(  # type: ignore[assignment]
        name="fake", budget=100, observe_launch=lambda seconds: None
    )
    worker.queue = SimpleNamespace(fail=lambda *args, **kwargs: None)  # type: ignore[assignment]
    worker.padding_rows = 0
    worker.graph_batches = 0
    worker._launches = 0
    claim: Any = SimpleNamespace(items=[], tokens=1)
    launched: list[object] = [worker._launch(claim, FLOATS) for _ in range(3)]
    assert launched == ["launched", None, "launched"]  # the second failed
    assert slots == [0, 1, 1], "the third batch took the slot of the one still running"


async def test_waiting_out_a_failed_launch_leaves_the_event_loop_free(
    make_engine: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed launch the worker waits for the device's stream (its copies may still
    read the slot): on a GPU as long as the batches in flight, for ever on a hung one. The
    loop, serving every other request and model, must not wait with it."""
    from embedx.devices import CpuAccelerator

    loop = asyncio.get_running_loop()
    loop_ran: list[bool] = []

    def synchronize(self: CpuAccelerator) -> None:  # a stream that ends once the loop has run
        ran = threading.Event()
        loop.call_soon_threadsafe(ran.set)
        loop_ran.append(ran.wait(PATIENCE_S))

    monkeypatch.setattr(CpuAccelerator, "synchronize", synchronize)
    async with make_engine(("cpu",), smoke_test=False) as engine:
        replica = engine.replicas[0]
        pack = replica.pack
        packed = 0

        def fails_first(*args: Any) -> Any:
            nonlocal packed
            packed += 1
            if packed == 1:
                raise RuntimeError("launch failed (injected)")
            return pack(*args)

        monkeypatch.setattr(replica, "pack", fails_first)
        result = await engine.embed(["a text", "another one"])  # the retry serves it
        assert len(result.vectors) == 2
        assert packed == 2
        assert loop_ran == [True], "the loop waited for the stream"


async def test_a_device_short_of_memory_for_a_probe_batch_is_skipped_and_closed(
    make_engine: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedx.engine import loading
    from embedx.engine import probe as probing

    original = probing.probe

    async def probe(replica: Any, plan: Any) -> Any:
        if replica.accelerator.info.key == "small":
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return await original(replica, plan)

    monkeypatch.setattr(loading, "probe", probe)
    async with make_engine(("cpu", "small")) as engine:
        assert [r.accelerator.info.key for r in engine.replicas] == ["cpu"]
        assert "out of memory" in next(iter(engine.skipped.values()))
        assert (await engine.embed(["still served"])).vectors.shape == (1, 384)
        skipped = next(a for a in engine.accelerators if a.info.key == "small")
    assert skipped._executor._shutdown  # closed with the engine, though it ran nothing


async def test_a_close_cancelled_midway_still_finishes(make_engine: Callable[..., Any]) -> None:
    async with make_engine() as engine:
        closing = asyncio.create_task(engine.close())
        await next_turn()  # the close has begun
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        await eventually_async(lambda: engine.queue.closed and not engine.replicas)


def test_a_load_that_failed_for_the_device_or_host_is_a_503_not_the_files_fault() -> None:
    from embedx.engine.loading import unbuildable
    from embedx.errors import InvalidModel, ModelUnavailable

    host: list[Exception] = [RuntimeError("CUDA error: an illegal memory access"),
                             OSError(5, "EIO"), MemoryError()]  # fmt: skip
    files: list[Exception] = [KeyError("hidden_size"), FileNotFoundError("model-2.safetensors"),
                              RuntimeError("size mismatch for embeddings.word.weight")]  # fmt: skip
    for error in host:
        assert isinstance(unbuildable("m", error), ModelUnavailable), error
    for error in files:
        assert isinstance(unbuildable("m", error), InvalidModel), error
