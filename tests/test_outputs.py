"""What a request's rows become: the cut, L2 and base64 on the host and on the device."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from embedx.engine import base64_rows
from embedx.engine.outputs import (
    FLOATS,
    OutputSpec,
    RequestRows,
    RowForm,
    batch_form,
    finish_on_device,
    settle,
    sole_job,
    write_batch,
)
from embedx.errors import UnsupportedDimensions
from embedx.scheduling import Item, Job


def spec(width: int = 3, **asked: object) -> OutputSpec:
    options: dict[str, object] = {"dimensions": None, "normalize": None}
    if asked.pop("base64", False):
        asked["encodings"] = ("base64",)
    options.update(asked)
    return settle(width=width, model_normalizes=False, default_normalize=True, **options)  # type: ignore[arg-type]


def finished(output: OutputSpec, vectors: np.ndarray, form: RowForm = FLOATS) -> np.ndarray:
    rows = RequestRows(output, len(vectors))
    rows.write(np.arange(len(vectors)), vectors, form)
    return rows.finished()


def test_matryoshka_truncates_then_renormalizes() -> None:
    vectors = np.array([[3.0, 4.0, 12.0]], dtype=np.float32)
    assert np.allclose(finished(spec(dimensions=2), vectors), [[0.6, 0.8]])
    with pytest.raises(UnsupportedDimensions):
        spec(dimensions=4)
    with pytest.raises(UnsupportedDimensions, match="whole number"):
        spec(dimensions=2.0)


def test_a_normalize_module_applies_even_when_normalize_is_off() -> None:
    vectors = np.array([[3.0, 4.0]], dtype=np.float32)
    normalizing = settle(width=2, model_normalizes=True, default_normalize=False,
                         dimensions=None, normalize=None)  # fmt: skip
    assert normalizing.form == RowForm(unit=True)
    assert np.allclose(finished(normalizing, vectors), [[0.6, 0.8]])
    assert np.allclose(finished(spec(width=2, normalize=False), vectors), vectors)


def test_a_cut_width_leaves_the_device_raw_rows_and_finishes_on_the_host() -> None:
    assert spec(dimensions=2, base64=True).form == FLOATS
    assert spec(base64=True).form == RowForm(unit=True, encodings=("base64",))
    vectors = np.array([[3.0, 4.0, 12.0]], dtype=np.float32)
    encoded = finished(spec(dimensions=2, base64=True), vectors)
    assert encoded.tobytes() == base64.b64encode(np.array([0.6, 0.8], "<f4").tobytes())


def test_base64_rows_go_into_the_sink_given() -> None:
    made: list[np.ndarray] = []

    def sink(count: int, width: int) -> np.ndarray:
        made.append(np.zeros((count, width + 2), np.uint8))
        return made[-1][:, 1:-1]

    vectors = np.array([[3.0, 4.0, 12.0], [1.0, 0.0, 0.0]], dtype=np.float32)
    out = finished(spec(base64=True, sink=sink), vectors)
    assert np.shares_memory(out, made[0])
    assert not made[0][:, [0, -1]].any(), "written outside the column it was given"
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert [bytes(row) for row in out] == [
        base64.b64encode(r.astype("<f4").tobytes()) for r in unit
    ]


def test_a_mixed_batch_is_made_what_its_requests_agree_on_and_each_finished_alone() -> None:
    plain = Job(1)
    plain.out = RequestRows(spec(normalize=False), 1)
    unit = Job(1)
    unit.out = RequestRows(spec(), 1)
    encoded = Job(1)
    encoded.out = RequestRows(spec(base64=True), 1)
    items = [Item(plain, 0, 1), Item(unit, 0, 1), Item(encoded, 0, 1)]
    assert sole_job(items) is None
    assert batch_form(items, None) == FLOATS
    assert batch_form(items[1:], None) == RowForm(unit=True)
    vectors = np.array([[3.0, 4.0, 0.0], [0.0, 3.0, 4.0], [4.0, 0.0, 3.0]], dtype=np.float32)
    write_batch(items, None, vectors, FLOATS)
    assert np.allclose(plain.out.finished(), vectors[:1])
    assert np.allclose(unit.out.finished(), vectors[1:2] / 5)
    expected = base64.b64encode((vectors[2] / 5).astype("<f4").tobytes())
    assert bytes(encoded.out.finished()[0]) == expected


def test_a_cancelled_request_gets_no_rows_and_sets_no_form() -> None:
    live = Job(1)
    live.out = RequestRows(spec(base64=True), 1)
    gone = Job(1)  # cancelled: the queue let its rows go
    items = [Item(gone, 0, 1), Item(live, 0, 1)]
    assert batch_form(items, None) == RowForm(unit=True, encodings=("base64",))
    rows = np.full((2, 16), ord("A"), np.uint8)  # two rows of three floats, encoded
    write_batch(items, None, rows, RowForm(unit=True, encodings=("base64",)))
    assert bytes(live.out.finished()[0]) == b"A" * 16


@pytest.mark.parametrize("dimensions", [384, 1024, 1001, 7, 1])  # 0, 2 and 1 '=' a row
def test_base64_rows_on_host_and_device_are_standard_base64(dimensions: int) -> None:
    rows = np.random.default_rng(0).standard_normal((6, dimensions)).astype(np.float32)
    every_byte = np.frombuffer(bytes(range(256)) * -(-dimensions // 64), "<f4")  # every sextet
    rows[0] = every_byte[:dimensions]
    expected = [base64.b64encode(row.astype("<f4").tobytes()) for row in rows]
    on_device = base64_rows.encode_on_device(torch.from_numpy(rows)).numpy()
    on_host = base64_rows.encode_on_host(np.asfortranarray(rows))
    for encoded in (on_host, on_device):
        assert encoded.shape == (6, base64_rows.width(dimensions))
        assert [row.tobytes() for row in encoded] == expected


def test_the_device_normalizes_then_encodes() -> None:
    rows = torch.tensor([[3.0, 4.0]])
    assert torch.allclose(finish_on_device(rows, RowForm(unit=True)), torch.tensor([[0.6, 0.8]]))
    encoded = finish_on_device(rows, RowForm(unit=True, encodings=("base64",))).numpy()
    assert encoded.tobytes() == base64.b64encode(np.array([0.6, 0.8], "<f4").tobytes())
