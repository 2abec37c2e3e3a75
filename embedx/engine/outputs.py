"""What a request's rows become: its output settled once (width, L2, its encodings, a scorer's
activation, where the rows go), the finishing a device does to a batch, and the rest done on the
host as rows are written."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from embedx.engine import base64_rows, quantized_rows, sparse_rows
from embedx.errors import InvalidOption, UnsupportedDimensions
from embedx.models.task import Activation, activate
from embedx.scheduling import Item, Job

if TYPE_CHECKING:
    import torch

    from embedx.engine.compact_rows import VocabRows

# Makes the (N, width) uint8 array a request's encoded rows are written into (its base64 rows:
# a view into a response laid out around them, server/protocol/openai.py), so that each row is
# copied once.
RowSink = Callable[[int, int], np.ndarray]


@dataclass(frozen=True, slots=True)
class Encoding:
    """One way a finished row is given: its numpy type, its width for a row of D floats, and
    how it is made on the host and on a device, alike to the bit."""

    dtype: type[np.generic]
    width: Callable[[int], int]
    on_host: Callable[[np.ndarray], np.ndarray]
    on_device: Callable[[torch.Tensor], torch.Tensor]


def _same(rows: Any) -> Any:
    return rows


def _floats(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows, "<f4")


def _columns(dimensions: int) -> int:
    return dimensions


# Every encoding a request can ask for, in the order a row holding several lays them out.
# int8 to ubinary are sentence-transformers' `quantize_embeddings` (engine/quantized_rows.py).
ENCODINGS: dict[str, Encoding] = {
    "float": Encoding(np.float32, _columns, _floats, _same),
    "base64": Encoding(np.uint8, base64_rows.width, base64_rows.encode_on_host,
                       base64_rows.encode_on_device),
    "int8": Encoding(np.int8, _columns, quantized_rows.int8_on_host,
                     quantized_rows.int8_on_device),
    "uint8": Encoding(np.uint8, _columns, quantized_rows.uint8_on_host,
                      quantized_rows.uint8_on_device),
    "binary": Encoding(np.int8, quantized_rows.bytes_width, quantized_rows.binary_on_host,
                       quantized_rows.binary_on_device),
    "ubinary": Encoding(np.uint8, quantized_rows.bytes_width, quantized_rows.ubinary_on_host,
                        quantized_rows.ubinary_on_device),
}  # fmt: skip
FLOAT = ("float",)


@dataclass(frozen=True, slots=True)
class RowForm:
    """What a device makes of a batch's rows before they come back: L2-normalized (`unit`),
    then given in `encodings` (`ENCODINGS`' names, in its order): float32 rows as they are,
    any other as each row's bytes, every encoding's side by side. With `outputs` beyond dense
    rows, a flat block of them (engine/sparse_rows.py), SPLADE's rows cut to their non-zeros,
    or to `top_k` (engine/compact_rows.py); `unit` then L2-normalizes the ColBERT vectors."""

    unit: bool = False
    encodings: tuple[str, ...] = FLOAT
    outputs: tuple[str, ...] = sparse_rows.DENSE
    top_k: int | None = None  # the most weights a sparse row of the batch keeps

    @property
    def encoded(self) -> bool:
        return self.encodings != FLOAT


FLOATS = RowForm()


def row_bytes(encodings: tuple[str, ...], dimensions: int) -> int:
    """The bytes a row of `dimensions` floats takes in `encodings`, side by side."""
    return sum(_bytes(name, dimensions) for name in encodings)


def _bytes(name: str, dimensions: int) -> int:
    encoding = ENCODINGS[name]
    return encoding.width(dimensions) * np.dtype(encoding.dtype).itemsize


def encode_on_host(rows: np.ndarray, encodings: tuple[str, ...]) -> np.ndarray:
    """(N, D) floats to (N, row_bytes) uint8: each encoding's bytes, side by side."""
    parts = [ENCODINGS[name].on_host(rows).view(np.uint8) for name in encodings]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def by_encoding(
    block: np.ndarray, encodings: tuple[str, ...], dimensions: int
) -> dict[str, np.ndarray]:
    """A request's finished rows, each encoding's apart in its own type: views of `block`
    (float32 rows, or the encodings' bytes side by side)."""
    if encodings == FLOAT:
        return {"float": block}
    parts: dict[str, np.ndarray] = {}
    start = 0
    for name in encodings:
        end = start + _bytes(name, dimensions)
        parts[name] = block[:, start:end].view(ENCODINGS[name].dtype)
        start = end
    return parts


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """How one request's rows are finished, settled from its options and its model."""

    width: int  # the model's row width
    dimensions: int  # the columns kept (matryoshka): `width` or fewer
    normalize: bool  # L2-normalized after the cut
    model_normalizes: bool  # the model ends in a Normalize module
    encodings: tuple[str, ...] = FLOAT  # ENCODINGS' names, in its order
    sink: RowSink | None = None  # where encoded rows go; None: a new array
    # a scorer's logits to scores (models/task.py), over all of a request's rows at once
    activation: Activation = "identity"
    multi: sparse_rows.MultiSpec | None = None  # what it asks beyond dense rows

    def rows(self, count: int) -> RequestRows | sparse_rows.MultiRows:
        """Where the request's `count` rows are written as batches finish."""
        if self.multi is not None:
            return sparse_rows.MultiRows(self, self.multi, count)
        return RequestRows(self, count)

    @property
    def cut(self) -> bool:
        return self.dimensions < self.width

    @property
    def unit(self) -> bool:
        """The request's rows come L2-normalized: it asked, or the model ends in a Normalize."""
        return self.normalize or self.model_normalizes

    @property
    def form(self) -> RowForm:
        """What the device makes of this request's rows: finished ones at full width; raw
        ones to be cut, which are normalized and encoded on the host after the cut."""
        if self.multi is not None:
            unit = self.unit and "colbert" in self.multi.outputs
            return RowForm(unit=unit, outputs=self.multi.outputs, top_k=self.multi.top_k)
        if self.cut:
            return FLOATS
        return RowForm(unit=self.unit, encodings=self.encodings)


def settle(
    *,
    width: int,
    model_normalizes: bool,
    default_normalize: bool,
    dimensions: int | None,
    normalize: bool | None,
    encodings: Sequence[str] = FLOAT,
    sink: RowSink | None = None,
    multi: sparse_rows.MultiSpec | None = None,
) -> OutputSpec:
    """A request's output: `normalize` None takes the server's default."""
    check_dimensions(dimensions, width)
    if multi is not None and tuple(encodings) != FLOAT:
        raise InvalidOption(
            "sparse rows and ColBERT vectors come with float dense rows only", param="encodings"
        )
    return OutputSpec(
        width=width,
        dimensions=width if dimensions is None else dimensions,
        normalize=default_normalize if normalize is None else normalize,
        model_normalizes=model_normalizes,
        encodings=checked_encodings(encodings),
        sink=sink,
        multi=multi,
    )


def checked_encodings(encodings: Sequence[str]) -> tuple[str, ...]:
    """Known encodings, at least one, in `ENCODINGS`' order (the layout of a row's bytes)."""
    given: object = encodings  # the library's callers: anything
    if isinstance(given, str) or not isinstance(given, Sequence) or not given:
        raise InvalidOption(
            f"encodings must be a non-empty list of {', '.join(ENCODINGS)}, got {encodings!r}",
            param="encodings",
        )
    for name in encodings:
        if name not in ENCODINGS:
            raise InvalidOption(
                f"unknown encoding {name!r}: the encodings are {', '.join(ENCODINGS)}",
                param="encodings",
            )
    return tuple(name for name in ENCODINGS if name in encodings)


def scores(labels: int, activation: Activation) -> OutputSpec:
    """A scorer's output: a logit per label, activated (`identity` for raw scores)."""
    return OutputSpec(labels, labels, False, False, activation=activation)


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
        if form.encoded:
            self.array = _sunk(spec.sink, count, row_bytes(form.encodings, spec.width))
        else:
            self.array = np.empty((count, spec.width), np.float32)

    def write(self, indices: np.ndarray, rows: np.ndarray, form: RowForm) -> None:
        """Put a batch's rows in their places, finished here as far as the device did not
        (`form`: what the device made of them)."""
        wanted = self.spec.form
        if form.encoded:  # then every request of the batch wanted just these rows
            self.array[indices] = rows
            return
        if wanted.unit and not form.unit:
            rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        self.array[indices] = encode_on_host(rows, wanted.encodings) if wanted.encoded else rows

    def extras(self) -> dict[str, Any]:
        """What the request gets beside its rows: nothing (sparse_rows.MultiRows' do)."""
        return {}

    def finished(self) -> np.ndarray:
        """The request's rows once all are written: cut to its width, then normalized and
        encoded, where that could not be done batch by batch; a scorer's, activated. Floats,
        or the encodings' bytes side by side (`by_encoding` parts them)."""
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
        if spec.encodings == FLOAT:
            return vectors
        encoded = encode_on_host(vectors, spec.encodings)
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


Rows = RequestRows | sparse_rows.MultiRows


def rows_of(job: Job) -> Rows | None:
    """Where a job's rows go; None once it is cancelled (the queue lets its rows go)."""
    return cast("Rows | None", job.out)


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
    wanted = {output for form in forms for output in form.outputs}
    if wanted != {"dense"}:  # every request's outputs in one block
        tops = [form.top_k for form in forms if "sparse" in form.outputs]
        top_k = None if None in tops else max(cast("list[int]", tops))
        return RowForm(outputs=tuple(o for o in sparse_rows.OUTPUTS if o in wanted), top_k=top_k)
    return RowForm(unit=bool(forms) and all(form.unit for form in forms))


def write_batch(
    items: Sequence[Item], sole: Job | None, rows: np.ndarray, form: RowForm,
    vocab: VocabRows | None = None,
) -> None:  # fmt: skip
    """Write a finished batch's rows into its live requests' rows; `sole` is the one request
    of all its items, if there is one (`sole_job`); `vocab`, its SPLADE rows, read from `rows`
    (Replica.taken)."""
    if form.outputs != sparse_rows.DENSE:
        _write_block(items, rows, form, vocab)
        return
    if sole is not None:
        out = rows_of(sole)
        if out is not None:
            indices = np.fromiter((item.index for item in items), np.intp, len(items))
            out.write(indices, rows, form)
        return
    for out, indices, picked in _by_request(items):
        out.write(indices, rows[picked], form)


def _write_block(
    items: Sequence[Item], block: np.ndarray, form: RowForm, vocab: VocabRows | None
) -> None:
    """A batch's block of several outputs read into its live requests' rows; one that wants
    dense rows alone takes them as raw floats."""
    requests = _by_request(items)
    multi = next((out.multi for out, _, _ in requests if isinstance(out, sparse_rows.MultiRows)),
                 None)  # fmt: skip
    if multi is None:
        return  # every request that asked beyond dense rows is gone
    assert multi.vocab_rows == (vocab is not None), "SPLADE's rows not read as such: a bug"
    width = requests[0][0].spec.width
    parts = sparse_rows.Block(items, block, form, width, vocab)
    for out, indices, picked in requests:
        if isinstance(out, sparse_rows.MultiRows):
            out.write_block(parts, indices, picked)
        else:
            out.write(indices, parts.dense[picked], FLOATS)


def _by_request(items: Sequence[Item]) -> list[tuple[Rows, np.ndarray, np.ndarray]]:
    """The live requests of a mixed batch, each with its items' indices and their rows."""
    grouped: dict[int, tuple[Rows, list[int], list[int]]] = {}
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
    host thread has every other batch to feed. On the CPU, the host's encoders (binascii's
    base64, numpy's packbits), on the device's own thread."""
    import torch

    if form.unit:  # never with outputs beyond dense rows: forward_outputs makes those
        # F.normalize's arithmetic without torch.norm's Python wrapper: a third less host time
        rows = rows / torch.linalg.vector_norm(rows, dim=1, keepdim=True).clamp_min(1e-12)
    if not form.encoded:
        return rows
    if rows.device.type == "cpu":
        return torch.from_numpy(encode_on_host(rows.numpy(), form.encodings))
    parts = [ENCODINGS[name].on_device(rows).view(torch.uint8) for name in form.encodings]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
