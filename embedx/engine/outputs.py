"""What a request's rows become: its output settled once (width, L2, base64, a scorer's
activation, where the rows go), the finishing a device does to a batch, and the rest done on the
host as rows are written."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from embedx.engine import base64_rows
from embedx.errors import UnsupportedDimensions
from embedx.models.task import Activation, activate
from embedx.scheduling import Item, Job

if TYPE_CHECKING:
    import torch

# Makes the (N, width) uint8 array a request's base64 rows are written into: a view into a
# response laid out around them (server/protocol/openai.py), so that each row is copied once.
RowSink = Callable[[int, int], np.ndarray]


@dataclass(frozen=True, slots=True)
class RowForm:
    """What a device makes of a batch's rows before they come back: L2-normalized (`unit`),
    then base64 of their float32 bytes (`base64`)."""

    unit: bool = False
    base64: bool = False


FLOATS = RowForm()


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """How one request's rows are finished, settled from its options and its model."""

    width: int  # the model's row width
    dimensions: int  # the columns kept (matryoshka): `width` or fewer
    normalize: bool  # L2-normalized after the cut
    model_normalizes: bool  # the model ends in a Normalize module
    base64: bool
    sink: RowSink | None = None  # where base64 rows go; None: a new array
    # a scorer's logits to scores (models/task.py), over all of a request's rows at once
    activation: Activation = "identity"

    @property
    def cut(self) -> bool:
        return self.dimensions < self.width

    @property
    def form(self) -> RowForm:
        """What the device makes of this request's rows: finished ones at full width; raw
        ones to be cut, which are normalized and encoded on the host after the cut."""
        if self.cut:
            return FLOATS
        return RowForm(unit=self.normalize or self.model_normalizes, base64=self.base64)


def settle(
    *,
    width: int,
    model_normalizes: bool,
    default_normalize: bool,
    dimensions: int | None,
    normalize: bool | None,
    base64: bool,
    sink: RowSink | None = None,
) -> OutputSpec:
    """A request's output: `normalize` None takes the server's default."""
    check_dimensions(dimensions, width)
    return OutputSpec(
        width=width,
        dimensions=width if dimensions is None else dimensions,
        normalize=default_normalize if normalize is None else normalize,
        model_normalizes=model_normalizes,
        base64=base64,
        sink=sink,
    )


def scores(labels: int, activation: Activation) -> OutputSpec:
    """A scorer's output: a logit per label, activated (`identity` for raw scores)."""
    return OutputSpec(labels, labels, False, False, False, activation=activation)


def check_dimensions(dimensions: int | None, full: int) -> None:
    if dimensions is None:
        return
    given: object = dimensions  # the library's callers: numpy's ints too, or anything
    if isinstance(given, bool) or not isinstance(given, numbers.Integral):
        raise UnsupportedDimensions(
            f"dimensions must be a whole number, got {dimensions!r}", param="dimensions"
        )
    if not 1 <= dimensions <= full:
        raise UnsupportedDimensions(
            f"dimensions must be between 1 and {full} for this model, got {dimensions}",
            param="dimensions",
        )


class RequestRows:
    """A request's rows as batches finish, in its order, then finished as its spec says."""

    __slots__ = ("array", "spec")

    def __init__(self, spec: OutputSpec, count: int) -> None:
        self.spec = spec
        form = spec.form
        if form.base64:
            self.array = _sunk(spec.sink, count, base64_rows.width(spec.width))
        else:
            self.array = np.empty((count, spec.width), np.float32)

    def write(self, indices: np.ndarray, rows: np.ndarray, form: RowForm) -> None:
        """Put a batch's rows in their places, finished here as far as the device did not
        (`form`: what the device made of them)."""
        wanted = self.spec.form
        if form.base64:  # then every request of the batch wanted just these rows
            self.array[indices] = rows
            return
        if wanted.unit and not form.unit:
            rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        self.array[indices] = base64_rows.encode_on_host(rows) if wanted.base64 else rows

    def finished(self) -> np.ndarray:
        """The request's rows once all are written: cut to its width, then normalized and
        encoded, where that could not be done batch by batch; a scorer's, activated."""
        spec = self.spec
        if spec.activation != "identity":
            return activate(self.array, spec.activation)
        if not spec.cut:
            return self.array
        vectors = self.array
        if spec.model_normalizes and not spec.normalize:  # else the final L2 subsumes it
            _normalize(vectors)
        vectors = np.ascontiguousarray(vectors[:, : spec.dimensions])
        if spec.normalize:
            _normalize(vectors)
        if not spec.base64:
            return vectors
        encoded = base64_rows.encode_on_host(vectors)
        if spec.sink is None:
            return encoded
        out = spec.sink(*encoded.shape)
        out[:] = encoded
        return out


def _sunk(sink: RowSink | None, count: int, width: int) -> np.ndarray:
    return np.empty((count, width), np.uint8) if sink is None else sink(count, width)


def _normalize(vectors: np.ndarray) -> None:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)  # as torch's F.normalize: a zero row stays zero
    vectors /= norms


def rows_of(job: Job) -> RequestRows | None:
    """Where a job's rows go; None once it is cancelled (the queue lets its rows go)."""
    return cast("RequestRows | None", job.out)


def sole_job(items: Sequence[Item]) -> Job | None:
    """The one request every text of a batch belongs to (the common case), or None."""
    first = items[0].job
    return first if all(item.job is first for item in items) else None


def batch_form(items: Sequence[Item], sole: Job | None) -> RowForm:
    """What the device makes of a batch's rows: what its requests want, where they agree;
    otherwise unit vectors if every request wants those, and floats."""
    if sole is not None:
        rows = rows_of(sole)
        return rows.spec.form if rows is not None else FLOATS
    forms = {rows.spec.form for job in {item.job for item in items} if (rows := rows_of(job))}
    if len(forms) == 1:
        return forms.pop()
    return RowForm(unit=bool(forms) and all(form.unit for form in forms))


def write_batch(items: Sequence[Item], sole: Job | None, rows: np.ndarray, form: RowForm) -> None:
    """Write a finished batch's rows into its live requests' rows; `sole` is the one request
    of all its items, if there is one (`sole_job`)."""
    if sole is not None:
        out = rows_of(sole)
        if out is not None:
            indices = np.fromiter((item.index for item in items), np.intp, len(items))
            out.write(indices, rows, form)
        return
    for out, indices, picked in _by_request(items):
        out.write(indices, rows[picked], form)


def _by_request(items: Sequence[Item]) -> list[tuple[RequestRows, np.ndarray, np.ndarray]]:
    """The live requests of a mixed batch, each with its items' indices and their rows."""
    grouped: dict[int, tuple[RequestRows, list[int], list[int]]] = {}
    for row, item in enumerate(items):
        out = rows_of(item.job)
        if out is None:
            continue
        entry = grouped.get(id(out))
        if entry is None:
            entry = grouped[id(out)] = (out, [], [])
        entry[1].append(item.index)
        entry[2].append(row)
    return [(out, np.array(i, np.intp), np.array(r, np.intp)) for out, i, r in grouped.values()]


def finish_on_device(rows: torch.Tensor, form: RowForm) -> torch.Tensor:
    """A batch's (B, D) float32 rows made into `form` on their device, on its stream: the
    host thread has every other batch to feed. On the CPU, base64 is binascii's, on the
    device's own thread."""
    import torch
    import torch.nn.functional as F

    if form.unit:
        rows = F.normalize(rows, dim=1, eps=1e-12)
    if form.base64:
        if rows.device.type == "cpu":
            return torch.from_numpy(base64_rows.encode_on_host(rows.numpy()))
        rows = base64_rows.encode_on_device(rows)
    return rows
