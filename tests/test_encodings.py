"""Compact encodings (int8, uint8, binary, ubinary) bit for bit as sentence-transformers'
`quantize_embeddings` makes them over [-1, 1]: rows quantized on the host and by the device's
torch ops, a row of several encodings parted, the library's `precision`, and /v1/embeddings'
`encoding_format` and `embedding_types` through httpx and the OpenAI SDK."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sentence_transformers.util.quantization import quantize_embeddings

from embedx import Embedder
from embedx.engine import quantized_rows
from embedx.engine.outputs import (
    ENCODINGS,
    FLOATS,
    RequestRows,
    RowForm,
    by_encoding,
    finish_on_device,
    settle,
)
from embedx.errors import InvalidOption
from tests.support.models import MINILM_NAME
from tests.support.server import InProcess, assert_envelope, in_process, sdk

QUANTIZED = ("int8", "uint8", "binary", "ubinary")


def quantized(vectors: np.ndarray, precision: str) -> np.ndarray:
    """sentence-transformers' own, over the fixed range embedx states."""
    width = vectors.shape[1]
    ranges = np.stack([np.full(width, -1.0), np.full(width, 1.0)])
    result = quantize_embeddings(vectors, precision, ranges=ranges)  # type: ignore[arg-type]
    assert isinstance(result, np.ndarray)
    return result


def awkward_rows(dimensions: int) -> np.ndarray:
    """Random rows, and each level's lower edge with its float32 neighbours, zeros of both
    signs, and values past the range."""
    rng = np.random.default_rng(dimensions)
    edges = quantized_rows.LOW + np.arange(256, dtype=np.float32) * quantized_rows.STEP
    special = np.concatenate([
        edges, np.nextafter(edges, np.float32(-2)), np.nextafter(edges, np.float32(2)),
        np.array([0.0, -0.0, 1.0, -1.0, 1.5, -1.5, 1e-30, -1e-30], np.float32),
    ])  # fmt: skip
    special = np.resize(special, (-(-len(special) // dimensions), dimensions))
    random = (rng.standard_normal((20, dimensions)) * 0.4).astype(np.float32)
    return np.concatenate([random, special]).astype(np.float32)


@pytest.mark.parametrize("dimensions", [384, 9, 8, 1])
@pytest.mark.parametrize("name", QUANTIZED)
def test_each_encoding_on_the_host_and_the_device_is_quantize_embeddings_bit_for_bit(
    name: str, dimensions: int
) -> None:
    rows = awkward_rows(dimensions)
    expected = quantized(rows, name)
    encoding = ENCODINGS[name]
    on_host = encoding.on_host(rows)
    on_device = encoding.on_device(torch.from_numpy(rows)).numpy()
    for got in (on_host, on_device):
        assert got.dtype == expected.dtype == encoding.dtype
        assert got.shape == expected.shape == (len(rows), encoding.width(dimensions))
        assert np.array_equal(got, expected)


def test_a_row_of_several_encodings_parts_into_each_as_if_asked_alone() -> None:
    rows = awkward_rows(7)[:24]
    unit = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    spec = settle(width=7, model_normalizes=False, default_normalize=True, dimensions=None,
                  normalize=None, encodings=["ubinary", "float", "base64", "int8"])  # fmt: skip
    assert spec.encodings == ("float", "base64", "int8", "ubinary")  # in the table's order
    made_here = RequestRows(spec, len(rows))
    made_here.write(np.arange(len(rows)), rows, FLOATS)
    on_device = finish_on_device(torch.from_numpy(rows), spec.form).numpy()
    made_there = RequestRows(spec, len(rows))
    made_there.write(np.arange(len(rows)), on_device, spec.form)
    for block in (made_here.finished(), made_there.finished()):
        parts = by_encoding(block, spec.encodings, 7)
        assert list(parts) == list(spec.encodings)
        assert np.allclose(parts["float"], unit, atol=1e-6)
        floats = parts["float"].copy()
        decoded = [np.frombuffer(base64.b64decode(row.tobytes()), "<f4") for row in parts["base64"]]
        assert np.array_equal(np.stack(decoded), floats)
        for name in ("int8", "ubinary"):
            assert np.array_equal(parts[name], quantized(floats, name))


def test_the_cut_comes_first_then_the_normalizing_then_the_quantizing() -> None:
    rows = awkward_rows(12)[:20]
    spec = settle(width=12, model_normalizes=False, default_normalize=True, dimensions=5,
                  normalize=None, encodings=["int8"])  # fmt: skip
    assert spec.form == FLOATS  # a cut row is finished on the host
    made = RequestRows(spec, len(rows))
    made.write(np.arange(len(rows)), rows, spec.form)
    cut = rows[:, :5] / np.maximum(np.linalg.norm(rows[:, :5], axis=1, keepdims=True), 1e-12)
    got = by_encoding(made.finished(), spec.encodings, 5)["int8"]
    assert np.array_equal(got, quantized(cut.astype(np.float32), "int8"))


@pytest.mark.parametrize("encodings", [["int4"], [], "int8", [5]])
def test_an_unknown_encoding_is_refused_naming_the_encodings(encodings: Any) -> None:
    with pytest.raises(InvalidOption, match="float, base64, int8, uint8, binary, ubinary"):
        settle(width=3, model_normalizes=False, default_normalize=True, dimensions=None,
               normalize=None, encodings=encodings)  # fmt: skip


def test_the_device_warms_every_encoding_at_once() -> None:
    rows = torch.from_numpy(awkward_rows(16)[:3])
    form = RowForm(unit=True, encodings=tuple(ENCODINGS))
    block = finish_on_device(rows, form).numpy()
    parts = by_encoding(block, form.encodings, 16)
    assert {name: part.shape[1] for name, part in parts.items()} == {
        "float": 16, "base64": 88, "int8": 16, "uint8": 16, "binary": 2, "ubinary": 2
    }  # fmt: skip


# -- the library -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder(minilm_dir: Path) -> Iterator[Embedder]:
    with Embedder(minilm_dir, pooling="mean") as library:
        yield library


@pytest.mark.parametrize("dimensions", [None, 100])
def test_the_library_gives_each_precision_as_quantize_embeddings_does(
    embedder: Embedder, reference_texts: list[str], dimensions: int | None
) -> None:
    texts = reference_texts[:24]
    floats = embedder.embed(texts, dimensions=dimensions)
    width = dimensions or 384
    assert np.array_equal(embedder.embed(texts, dimensions=dimensions, precision="float32"), floats)
    for precision in QUANTIZED:
        got = embedder.embed(texts, dimensions=dimensions, precision=precision)
        expected = quantized(floats, precision)
        assert got.dtype == expected.dtype
        assert got.shape == (24, width if precision.endswith("int8") else -(-width // 8))
        assert np.array_equal(got, expected), precision


def test_the_library_refuses_a_precision_naming_those_it_takes(embedder: Embedder) -> None:
    for precision in ("float16", "base64", None):
        with pytest.raises(InvalidOption, match="float32, int8, uint8, binary, ubinary"):
            embedder.embed("x", precision=precision)  # type: ignore[arg-type]


# -- the server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide: the app below serves every server test of the module


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[InProcess]:
    async with in_process({"preload": MINILM_NAME}) as app:
        yield app


async def embed(app: InProcess, body: dict[str, Any]) -> Any:
    response = await app.client.post("/v1/embeddings", json={"model": MINILM_NAME, **body})
    assert response.status_code == 200, response.text
    return response.json()["data"]


def floats_of(data: list[dict[str, Any]]) -> np.ndarray:
    return np.array([item["embedding"] for item in data], np.float32)


@pytest.mark.anyio
@pytest.mark.parametrize("dimensions", [None, 64])
async def test_each_encoding_format_is_a_list_of_quantize_embeddings_integers(
    served: InProcess, reference_texts: list[str], dimensions: int | None
) -> None:
    texts = reference_texts[:16]
    asked = {"input": texts, "dimensions": dimensions}
    floats = floats_of(await embed(served, asked))
    for name in QUANTIZED:
        data = await embed(served, {**asked, "encoding_format": name})
        assert [item["index"] for item in data] == list(range(16))
        rows = [item["embedding"] for item in data]
        assert all(isinstance(value, int) for row in rows for value in row)
        assert np.array_equal(np.array(rows), quantized(floats, name)), name


@pytest.mark.anyio
async def test_embedding_types_give_each_row_in_every_type_asked(
    served: InProcess, reference_texts: list[str]
) -> None:
    texts = reference_texts[16:28]
    floats = floats_of(await embed(served, {"input": texts, "dimensions": 200}))
    types = ["ubinary", "float", "int8", "base64", "binary", "uint8"]
    # the SDK's encoding_format, sent on its own, gives way to embedding_types
    asked = {"input": texts, "dimensions": 200, "encoding_format": "base64"}
    data = await embed(served, {**asked, "embedding_types": types})
    rows = [item["embedding"] for item in data]
    assert all(set(row) == set(types) for row in rows)
    assert np.array_equal(np.array([row["float"] for row in rows], np.float32), floats)
    encoded = [np.frombuffer(base64.b64decode(row["base64"]), "<f4") for row in rows]
    assert np.array_equal(np.stack(encoded), floats)
    for name in QUANTIZED:
        assert np.array_equal(np.array([row[name] for row in rows]), quantized(floats, name))
    one = await embed(served, {"input": texts[:2], "embedding_types": ["int8"]})
    assert set(one[0]["embedding"]) == {"int8"}


@pytest.mark.anyio
async def test_the_openai_sdk_takes_compact_encodings_through_extra_body(
    served: InProcess, reference_texts: list[str]
) -> None:
    texts = reference_texts[:8]
    async with sdk(served.app) as client:
        floats = np.array(
            [d.embedding for d in (await client.embeddings.create(
                model=MINILM_NAME, input=texts)).data], np.float32)  # fmt: skip
        binary = await client.embeddings.create(
            model=MINILM_NAME, input=texts, extra_body={"encoding_format": "binary"}
        )
        rows = np.array([d.embedding for d in binary.data])
        assert rows.shape == (8, 48)
        assert np.array_equal(rows, quantized(floats, "binary"))
        typed = await client.embeddings.create(
            model=MINILM_NAME, input=texts, extra_body={"embedding_types": ["int8", "float"]}
        )
        by_type: Any = [d.embedding for d in typed.data]
        assert np.array_equal(np.array([row["int8"] for row in by_type]), quantized(floats, "int8"))
        assert np.array_equal(np.array([row["float"] for row in by_type], np.float32), floats)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("encoding_format", "int4"),
        ("encoding_format", ["int8"]),
        ("embedding_types", ["float", "int4"]),
        ("embedding_types", []),
        ("embedding_types", "int8"),
        ("embedding_types", [8]),
        ("embedding_types", ["int8", "int8"]),
    ],
)
async def test_a_bad_encoding_is_a_400_naming_the_accepted_ones(
    served: InProcess, field: str, value: Any
) -> None:
    body = {"model": MINILM_NAME, "input": "x", field: value}
    response = await served.client.post("/v1/embeddings", json=body)
    error = assert_envelope(response, 400, "invalid_option")
    assert error["param"] == field
    if value != ["int8", "int8"]:
        assert "float, base64, int8, uint8, binary, ubinary" in error["message"]
    response = await served.client.post("/v1/embeddings", json={**body, field: None})
    assert response.status_code == 200  # and the next request is served
