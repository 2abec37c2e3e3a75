"""A corpus job's OUTPUT: Parquet (id, vector, tokens) written as its chunks finish, or its
finished chunks joined, one in memory at a time, into Parquet, a .npy matrix or safetensors
(vectors, tokens, rows)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embedx.jobs.parts import part_bad, read_part

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq


def output_format(output: Path) -> str:
    """What OUTPUT's name asks for: .npy, .safetensors, else Parquet."""
    suffix = output.suffix.lower()
    return {".npy": "npy", ".safetensors": "safetensors"}.get(suffix, "parquet")


def join(parts: Sequence[Path], output: Path, width: int, temporary: Path) -> int:
    """Write the parts' rows, in order, to `output` (through `temporary`, renamed into place
    once whole); returns the rows written."""
    rows: int = sum(read_part(p).num_rows for p in parts)
    write = {"parquet": _parquet, "npy": _npy, "safetensors": _safetensors}
    write[output_format(output)](parts, temporary, width, rows)
    os.replace(temporary, output)
    return rows


def write_bad(parts: Sequence[Path], side: Path) -> int:
    """The parts' bad lines, one JSON object a line, in `side` (removed when there are none:
    an old one would speak of another run's lines); returns how many."""
    lines = [json.dumps(b) + "\n" for p in parts for b in part_bad(p)]
    if not lines:
        side.unlink(missing_ok=True)
        return 0
    temporary = side.with_name(f".{side.name}.tmp")
    temporary.write_text("".join(lines))
    os.replace(temporary, side)
    return len(lines)


def _parquet(parts: Sequence[Path], temporary: Path, width: int, rows: int) -> None:
    import pyarrow as pa

    strings = any(pa.types.is_string(read_part(p).schema.field("id").type) for p in parts)
    schema = _schema(strings, width)
    with writer_of(temporary, schema) as writer:
        for part in parts:
            writer.write_table(_columns(read_part(part), schema))


def _schema(strings: bool, width: int) -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string() if strings else pa.int64()),
            ("vector", pa.list_(pa.float32(), width)),
            ("tokens", pa.int32()),
        ]
    )


def writer_of(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    """OUTPUT's writer. Vectors get no dictionary and no statistics: float vectors gain
    nothing by them, and they took half of the writing's time."""
    import pyarrow.parquet as pq

    return pq.ParquetWriter(path, schema, use_dictionary=False, write_statistics=["id", "tokens"])


def _columns(part: pa.Table, schema: pa.Schema) -> pa.Table:
    """A part's table (or a chunk's, as its part holds it) as OUTPUT's rows."""
    table = part.select(["id", "vector", "tokens"]).replace_schema_metadata(None)
    return table.cast(schema)


class StreamedParquet:
    """A Parquet OUTPUT written as the job's chunks finish, in order, so that no join reads
    and writes every vector again once they are all done (it took a third of the job's time
    for 40,000 texts). A chunk whose ids are of another type than the first's (numbers, then
    strings) stops it: the parts are joined then, as for .npy and safetensors."""

    def __init__(self, temporary: Path, width: int) -> None:
        self.temporary = temporary
        self.width = width
        self.broken = False
        self._schema: pa.Schema | None = None
        self._writer: pq.ParquetWriter | None = None

    def add(self, table: pa.Table) -> None:
        """The next chunk's rows, its table as its part holds it."""
        import pyarrow as pa

        if self.broken or table.num_rows == 0:
            return
        strings = pa.types.is_string(table.schema.field("id").type)
        if self._schema is None:
            self._schema = _schema(strings, self.width)
            self._writer = writer_of(self.temporary, self._schema)
        elif strings != pa.types.is_string(self._schema.field("id").type):
            self.close()
            self.temporary.unlink(missing_ok=True)
            self.broken = True
            return
        assert self._writer is not None
        self._writer.write_table(_columns(table, self._schema))

    def add_part(self, part: Path) -> None:
        """The next chunk, finished by an earlier run: from its part."""
        self.add(read_part(part))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def finish(self, output: Path) -> bool:
        """OUTPUT put in place; False where the stream stopped or held no rows: the parts
        are to be joined."""
        self.close()
        if self.broken or self._schema is None:
            return False
        os.replace(self.temporary, output)
        return True


def _npy(parts: Sequence[Path], temporary: Path, width: int, rows: int) -> None:
    matrix = np.lib.format.open_memmap(temporary, "w+", np.float32, (rows, width))
    at = 0
    for part in parts:
        vectors = _vectors(part, width)
        matrix[at : at + len(vectors)] = vectors
        at += len(vectors)
    matrix.flush()
    del matrix


def _safetensors(parts: Sequence[Path], temporary: Path, width: int, rows: int) -> None:
    """safetensors' layout written a part at a time: a little-endian u64 header length, the
    JSON header (padded with spaces to 8 bytes), then each tensor's bytes in header order."""
    tensors = [("vectors", "F32", [rows, width], 4 * width), ("tokens", "I32", [rows], 4),
               ("rows", "I64", [rows], 8)]  # fmt: skip
    header: dict[str, Any] = {"__metadata__": {"format": "embedx corpus job"}}
    offset = 0
    for name, dtype, shape, row_bytes in tensors:
        end = offset + rows * row_bytes
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}
        offset += rows * row_bytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(temporary, "wb") as sink:
        sink.write(struct.pack("<Q", len(encoded)) + encoded)
        for part in parts:
            sink.write(_vectors(part, width).tobytes())
        for column, dtype in (("tokens", "<i4"), ("row", "<i8")):
            for part in parts:
                values = read_part(part).column(column).to_numpy()
                sink.write(values.astype(dtype).tobytes())


def _vectors(part: Path, width: int) -> np.ndarray:
    column = read_part(part).column("vector").combine_chunks()
    values: np.ndarray = column.flatten().to_numpy(zero_copy_only=False)
    return values.reshape(-1, width)
