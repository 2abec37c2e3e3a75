"""The library's synchronous facade, as scripts, notebooks and async code use it."""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embedx import Embedder
from tests.support.processes import run_script
from tests.support.waiting import PATIENCE_S, eventually


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path) -> Iterator[Embedder]:
    """One Embedder for the tests that only call it."""
    with Embedder(minilm_dir, pooling="mean") as embedder:
        yield embedder


def test_a_text_that_is_not_valid_unicode_is_named(minilm: Embedder) -> None:
    from embedx.errors import InvalidInput

    # what undecodable bytes become when read with surrogateescape (a C-locale stdin)
    with pytest.raises(InvalidInput, match=r"input\[1\] is not valid Unicode"):
        minilm.embed(["fine", "caf\udce9"])
    assert minilm.embed(["café"]).shape == (1, 384)


def test_arguments_of_the_wrong_type_are_named_not_a_type_error(
    minilm: Embedder, minilm_dir: Path
) -> None:
    from embedx.errors import InvalidInput, InvalidOption

    for texts in (5, None):
        with pytest.raises(InvalidInput, match="texts must be a list of strings"):
            minilm.embed(texts)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="normalize must be True or False"):
        minilm.embed(["x"], normalize="no")  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="truncate must be True or False"):
        minilm.embed(["x"], truncate=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="max_seq_len must be a whole number"):
        Embedder(minilm_dir, pooling="mean", max_seq_len="16")  # type: ignore[arg-type]


def test_any_sequence_of_texts_and_numpy_ints_for_dimensions_are_taken(minilm: Embedder) -> None:
    expected = minilm.embed(["a", "b"], dimensions=64)
    got = minilm.embed(collections.deque(["a", "b"]), dimensions=np.int64(64))  # type: ignore[arg-type]
    assert np.array_equal(got, expected)


def test_the_short_name_of_a_catalog_model_is_pointed_to_the_full_one() -> None:
    import embedx

    with pytest.raises(
        embedx.EmbedxError, match=r"did you mean 'sentence-transformers/all-MiniLM-L6-v2'\?$"
    ):
        Embedder("all-MiniLM-L6-v2")


def test_settings_and_overrides_together_are_refused(minilm_dir: Path) -> None:
    from embedx.config import load_settings

    with pytest.raises(TypeError, match="not both"):  # the overrides used to be dropped
        Embedder(minilm_dir, pooling="mean", settings=load_settings(), wrapping="q: {text}")


def test_closing_an_embedder_ends_the_calls_in_flight_with_an_error(minilm_dir: Path) -> None:
    embedder = Embedder(minilm_dir, pooling="mean")
    texts = [f"text {i} " + "with words enough " * 10 for i in range(1500)]
    outcomes: list[BaseException | None] = []

    def call() -> None:
        try:
            embedder.embed(texts)
            outcomes.append(None)
        except BaseException as exc:  # what the caller hears
            outcomes.append(exc)

    async def acall() -> None:
        try:
            await embedder.aembed(texts)
            outcomes.append(None)
        except BaseException as exc:
            outcomes.append(exc)

    callers = [threading.Thread(target=call), threading.Thread(target=asyncio.run, args=(acall(),))]
    for caller in callers:
        caller.start()
    # both in the engine (tokenizing or queued), or done already
    engine = embedder._engine
    eventually(lambda: engine._jobs_in_flight + len(outcomes) == 2)
    embedder.close()
    for caller in callers:
        caller.join(PATIENCE_S)
        assert not caller.is_alive(), "a call outlived its Embedder's close"
    assert len(outcomes) == 2
    for outcome in outcomes:  # an error that says so, or the vectors if they were in time
        assert outcome is None or "Embedder was closed" in str(outcome), repr(outcome)


@pytest.mark.process
def test_closing_an_embedder_mid_call_leaves_no_asyncio_noise(minilm_dir: Path) -> None:
    done = run_script(
        """
        import gc, sys, threading
        from embedx import Embedder
        from tests.support.waiting import eventually
        e = Embedder(sys.argv[1], pooling="mean")

        def call():
            try:
                e.embed(["many words " * 100] * 4000)  # still tokenizing at the close
            except RuntimeError as exc:
                print(exc, flush=True)

        caller = threading.Thread(target=call)
        caller.start()
        eventually(lambda: e._engine._jobs_in_flight)  # until the call is in the engine
        e.close()
        caller.join()
        gc.collect()
        """,
        str(minilm_dir),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "the Embedder was closed while this call ran"
    assert "never retrieved" not in done.stderr, done.stderr  # a request's failed future
    assert "Task was destroyed" not in done.stderr, done.stderr


@pytest.mark.process
def test_an_embedder_left_open_keeps_working_when_another_closes(minilm_dir: Path) -> None:
    done = run_script(
        """
        import gc, sys
        from embedx import Embedder
        Embedder(sys.argv[1], pooling="mean").embed(["left open"])  # dropped, never closed
        with Embedder(sys.argv[1], pooling="mean") as e:  # closing it unfreezes the heap
            print(e.embed(["closed"]).shape)
        gc.collect()
        """,
        str(minilm_dir),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(1, 384)"
    assert "Task was destroyed" not in done.stderr, done.stderr


def test_a_call_that_found_the_embedder_open_as_it_closed_is_told_so(minilm_dir: Path) -> None:
    embedder = Embedder(minilm_dir, pooling="mean")
    loop = embedder._open_loop()  # a call on another thread got this far, then:
    embedder.close()

    async def work() -> None:
        pass

    with pytest.raises(RuntimeError, match="this Embedder is closed"):
        loop.call(work())  # scheduled on the stopped loop, it would never run


@pytest.mark.process
def test_a_forked_child_is_told_to_make_its_own_embedder(minilm_dir: Path) -> None:
    done = run_script(
        """
        import multiprocessing, sys
        from embedx import Embedder
        e = Embedder(sys.argv[1], pooling="mean")

        def child():
            try:
                e.embed(["x"])
            except RuntimeError as exc:
                print(exc, flush=True)

        process = multiprocessing.get_context("fork").Process(target=child)
        process.start()
        process.join(60)
        print(process.exitcode, e.embed(["x"]).shape)
        """,
        str(minilm_dir),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == [
        "an Embedder does not cross a fork: make one in the child process",
        "0 (1, 384)",
    ], done.stdout


@pytest.mark.process
def test_a_script_that_never_closes_its_embedder_still_exits(minilm_dir: Path) -> None:
    done = run_script(
        """
        import sys
        from embedx import Embedder
        e = Embedder(sys.argv[1], pooling="mean")
        print(e.embed(["a text"]).shape)
        """,
        str(minilm_dir),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(1, 384)"


@pytest.mark.process
def test_an_interrupted_embed_drops_the_texts_it_had_not_embedded(
    minilm_dir: Path, reference_texts: list[str]
) -> None:
    # In a process of its own: a SIGINT that landed after the embed would stop pytest.
    done = run_script(
        """
        import os, signal, sys, threading
        from embedx import Embedder
        from tests.support.waiting import eventually
        # as an interactive Python has it: a shell's background job inherits SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        e = Embedder(sys.argv[1], pooling="mean")
        texts = [f"text number {i}, " + "long enough to take a while " * 8 for i in range(4000)]

        def interrupt():  # once the call is in the engine
            eventually(lambda: e._engine._jobs_in_flight)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt).start()
        try:
            e.embed(texts)
            print("finished")
        except KeyboardInterrupt:
            print("interrupted, requests finished:", e._engine.requests)
        e.embed(["one more"])
        print("left", e._engine.queue.pending_items)
        """,
        str(minilm_dir),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    # at once, not after the whole embed (which counts as a request finished)
    assert lines[0] == "interrupted, requests finished: 0", done.stdout
    assert lines[1] == "left 0", done.stdout


@pytest.mark.anyio
async def test_aembed_runs_from_another_loop_and_cancelling_it_drops_its_texts(
    minilm_dir: Path, reference_texts: list[str]
) -> None:
    with Embedder(minilm_dir, pooling="mean") as embedder:
        awaited = await embedder.aembed(reference_texts[:20])
        assert np.array_equal(awaited, embedder.embed(reference_texts[:20]))
        many = [text + " and more words" * 8 for text in reference_texts] * 10
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(embedder.aembed(many), 0.3)
        await embedder.aembed(["one more"])
        assert embedder._engine.queue.pending_items == 0


def test_a_batch_timeout_shorter_than_a_load_still_loads(minilm_dir: Path) -> None:
    """The load's warm-up batches have no expected time to be held to: at least 60 s."""
    # Its probe batches alone: the smoke test's and a request's batch are held to 1 ms and
    # 20 times their expected time, which a busy machine can pass.
    with Embedder(
        str(minilm_dir), pooling="mean", batch_timeout_s=0.001, smoke_test_on_load=False
    ) as embedder:
        assert [slot.active for slot in embedder._engine.queue.devices] == [True]
        assert embedder._engine.state.value == "ready"


def test_prompts_of_a_sentence_transformers_config_are_the_ones_it_applies(
    minilm_dir: Path, tmp_path: Path
) -> None:
    """As sentence-transformers: its default prompt unless one is asked for; `passage` takes
    a config's `document` prompt where it has none of that name; a prompt's text goes
    before the input's as it is, braces included."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    from embedx.errors import InvalidInput, InvalidModel

    directory = tmp_path / "prompted"
    shutil.copytree(minilm_dir, directory)
    config = {"prompts": {"query": "query: ", "document": "a {text} passage: "},
              "default_prompt_name": "query"}  # fmt: skip
    (directory / "config_sentence_transformers.json").write_text(json.dumps(config))
    reference = SentenceTransformer(str(directory), device="cpu")
    texts = ["The quick brown fox", "A lazy dog"]
    with Embedder(directory, pooling="mean") as embedder:
        assert np.abs(embedder.embed(texts) - reference.encode(texts)).max() < 1e-5
        passages = reference.encode(texts, prompt_name="document")
        assert np.abs(embedder.embed(texts, input_type="passage") - passages).max() < 1e-5
    catalog = tmp_path / "models.toml"  # a catalog entry's prompts replace the config's
    catalog.write_text(f'[models.prompted]\nsource = "{directory}"\npooling = "mean"\n'
                       'prompts = { query = "q: {text}" }\n')  # fmt: skip
    with Embedder("prompted", models_file=str(catalog)) as embedder:
        bare = reference.encode(texts, prompt="")  # no default prompt either
        assert np.abs(embedder.embed(texts) - bare).max() < 1e-5
        asked = embedder.embed(texts, input_type="query")
        assert np.array_equal(asked, embedder.embed(["q: " + text for text in texts]))
    config["prompts"] = {"query": 1}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(config))
    with pytest.raises(InvalidModel, match="prompts must map names to strings"):
        Embedder(directory, pooling="mean")
    config = {"prompts": {"query": "q: "}, "default_prompt_name": "classification"}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(config))
    with pytest.raises(InvalidModel, match="'classification' names none of its prompts"):
        Embedder(directory, pooling="mean")
    (directory / "config_sentence_transformers.json").write_text('{"prompts": {}}')
    with (
        Embedder(directory, pooling="mean") as embedder,
        pytest.raises(InvalidInput, match="has no prompt for input_type 'query'"),
    ):
        embedder.embed(texts, input_type="query")
