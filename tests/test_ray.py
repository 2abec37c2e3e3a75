"""Ray Data's EmbedBatches: a dataset embedded on a local Ray cluster of two CPU actors comes
back in order with the library's vectors; a batch's columns kept, its format checked."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from embedx.errors import InvalidInput
from embedx.ray import EmbedBatches
from tests.support.corpus import texts_of
from tests.support.settings import settings_of

# Texts cut to 32 tokens: the same real texts, at a third of the CPU time on two cores.
MAX_SEQ_LEN = 32
BLOCK_ROWS = 260  # the reference texts in two halves: a block and a batch each


@pytest.fixture(scope="module")
def batches(minilm_dir: Path) -> Iterator[EmbedBatches]:
    embed = EmbedBatches(
        minilm_dir, pooling="mean", max_seq_len=MAX_SEQ_LEN, settings=settings_of()
    )
    yield embed
    embed.close()


@pytest.mark.process
@pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")  # its own fields
def test_two_actors_on_a_local_ray_cluster_embed_a_dataset_in_order_as_the_library_does(
    minilm_dir: Path, batches: EmbedBatches, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1040 real texts (the reference corpus twice) in 4 blocks, two for each CPU actor.

    Bit for bit: each batch is one block, the texts the library embeds in one call here. The
    engine's vectors for a text can differ in their last bits (about 2e-7) with the batch it
    shares, since a batch's shape picks the CPU's matrix kernels; not with the thread count
    (the actors run one thread, this process two)."""
    import ray
    import ray.data

    texts = texts_of("reference_texts")
    assert len(texts) == 2 * BLOCK_ROWS
    rows = texts * 2
    table = pa.table({"id": np.arange(len(rows)), "text": rows})
    blocks = [table.slice(start, BLOCK_ROWS) for start in range(0, len(rows), BLOCK_ROWS)]
    context = ray.data.DataContext.get_current()
    monkeypatch.setattr(context.execution_options, "preserve_order", True)
    monkeypatch.setattr(context, "enable_progress_bars", False)

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 2**20,
        log_to_driver=False,
    )
    try:
        dataset = ray.data.from_arrow(blocks).map_batches(
            EmbedBatches,
            fn_constructor_kwargs={
                "model": str(minilm_dir),
                "pooling": "mean",
                "max_seq_len": MAX_SEQ_LEN,
                "settings": settings_of(),
            },
            batch_format="pyarrow",
            batch_size=BLOCK_ROWS,
            compute=ray.data.ActorPoolStrategy(size=2),
        )
        result = pa.concat_tables(ray.get(dataset.to_arrow_refs()))
    finally:
        ray.shutdown()

    assert result.column_names == ["id", "text", "embedding"]
    assert result.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert result.column("id").to_pylist() == list(range(len(rows)))
    assert result.column("text").to_pylist() == rows
    vectors = np.stack(result.column("embedding").to_numpy(zero_copy_only=False))
    halves = [
        batches.embedder.embed(texts[:BLOCK_ROWS]),
        batches.embedder.embed(texts[BLOCK_ROWS:]),
    ]
    assert np.array_equal(vectors, np.concatenate(halves * 2))


def test_a_numpy_batch_keeps_its_columns_and_gains_its_vectors_in_order(
    batches: EmbedBatches,
) -> None:
    texts = texts_of("lee50")[:5]
    batch = {"id": np.arange(5), "text": np.array(texts, dtype=object)}
    out = batches(batch)
    assert list(out) == ["id", "text", "embedding"]
    assert out["id"] is batch["id"]
    assert out["embedding"].dtype == np.float32
    assert np.array_equal(out["embedding"], batches.embedder.embed(texts))


def test_an_empty_batch_gets_no_vectors_of_the_model_width(batches: EmbedBatches) -> None:
    out = batches(pa.table({"text": pa.array([], pa.string())}))
    assert out.num_rows == 0
    assert out.schema.field("embedding").type == pa.list_(pa.float32(), 384)


def test_dimensions_cut_the_vectors_and_set_the_column_width(minilm_dir: Path) -> None:
    texts = texts_of("lee50")[:3]
    cut = EmbedBatches(
        minilm_dir, pooling="mean", dimensions=128, output_column="v", settings=settings_of()
    )
    try:
        out = cut(pa.table({"text": texts}))
        empty = cut(pa.table({"text": pa.array([], pa.string())}))
        expected = cut.embedder.embed(texts, dimensions=128)
    finally:
        cut.close()
    assert out.schema.field("v").type == pa.list_(pa.float32(), 128)
    assert empty.schema.field("v").type == pa.list_(pa.float32(), 128)
    assert np.array_equal(np.stack(out.column("v").to_numpy(zero_copy_only=False)), expected)


def test_a_batch_without_the_text_column_is_named_and_a_pandas_one_pointed_to_pyarrow(
    batches: EmbedBatches,
) -> None:
    with pytest.raises(InvalidInput, match=r"no column 'text' \(it has body\)"):
        batches(pa.table({"body": ["a text"]}))
    import pandas as pd  # type: ignore[import-untyped]  # (no stubs installed)

    with pytest.raises(TypeError, match="batch_format='pyarrow'"):
        batches(pd.DataFrame({"text": ["a text"]}))


def test_the_documented_script_parses_and_the_page_names_every_parameter() -> None:
    page = (Path(__file__).parent.parent / "docs" / "ray.md").read_text()
    (script,) = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    tree = ast.parse(script)
    taken = inspect.signature(EmbedBatches).parameters
    (given,) = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.keyword) and n.arg == "fn_constructor_kwargs"
    ]
    assert isinstance(given, ast.Dict)
    assert {ast.literal_eval(k) for k in given.keys if k is not None} <= set(taken)
    assert 'batch_format="pyarrow"' in script
    for name, parameter in taken.items():
        if parameter.kind is parameter.KEYWORD_ONLY:
            default = parameter.default
            shown = f'"{default}"' if isinstance(default, str) else repr(default)
            assert f"{name}={shown}" in page, name
