"""A corpus job's work folder, OUTPUT.parts/: the manifest that says which job it holds, and
each finished chunk as one Arrow file that appears whole (renamed into place) or not at all."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embedx.errors import InvalidInput
from embedx.jobs.inputs import Bad

if TYPE_CHECKING:
    import pyarrow as pa

MANIFEST = "manifest.json"
PART = re.compile(r"^chunk-(\d{6,})\.arrow$")
BAD_KEY = b"embedx.bad"  # a part's bad lines, in its schema's metadata


@dataclass(slots=True)
class Chunk:
    """A chunk's results: its good rows' ids, row numbers, vectors and token counts, and its
    bad lines."""

    index: int
    ids: list[str | int]
    rows: list[int]
    vectors: np.ndarray  # (len(ids), D) float32
    tokens: np.ndarray  # (len(ids),) int32
    bad: list[Bad] = field(default_factory=list)


class WorkFolder:
    """OUTPUT.parts/ beside OUTPUT: a job's finished chunks until they are joined."""

    def __init__(self, output: Path, manifest: dict[str, Any]) -> None:
        self.path = output.parent / (output.name + ".parts")
        self.manifest = manifest

    def open(self) -> dict[int, Path]:
        """The chunks already finished by an earlier run of this job (none for a new one), their
        files by index.
        A folder of another job (other inputs, or settings) is an error: its parts are not
        this job's, and are not removed without asking."""
        manifest = self.path / MANIFEST
        if manifest.exists():
            held = json.loads(manifest.read_text())
            if held != self.manifest:
                differ = sorted(
                    k for k in {*held, *self.manifest} if held.get(k) != self.manifest.get(k)
                )
                # The chunk size alone (an older default, or another --chunk-texts): the
                # folder's own resumes it.
                size = held.get("chunk_texts") if differ == ["chunk_texts"] else None
                again = f"; --chunk-texts {size} resumes it" if isinstance(size, int) else ""
                raise InvalidInput(
                    f"{self.path} holds the parts of another job (its {', '.join(differ)} "
                    f"differ from this one's): remove that folder to start this job over{again}"
                )
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            write_atomically(manifest, json.dumps(self.manifest, indent=2).encode())
        for stray in self.path.glob(".*.tmp"):  # a write a crash cut short
            stray.unlink()
        return self.parts()

    def parts(self) -> dict[int, Path]:
        """The finished chunks' files by index."""
        found = {}
        for path in self.path.iterdir():
            match = PART.match(path.name)
            if match:
                found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    def write(self, index: int, table: pa.Table) -> None:
        """Write a finished chunk, as `part_table` made it; it appears under its name only
        once whole. Arrow's own file format: its columns as they lie in memory, where
        Parquet's encoding took five times the CPU (to be read back only on a resume)."""
        import pyarrow as pa

        name = f"chunk-{index:06d}.arrow"
        temporary = self.path / f".{name}.tmp"
        with open(temporary, "wb") as sink:
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temporary, self.path / name)

    def remove(self) -> None:
        shutil.rmtree(self.path)


def part_table(chunk: Chunk) -> pa.Table:
    """A chunk as its part holds it: id, vector, tokens, row; its bad lines in the metadata."""
    import pyarrow as pa

    width = chunk.vectors.shape[1]
    flat = pa.array(np.ascontiguousarray(chunk.vectors, dtype=np.float32).reshape(-1))
    ids = (
        pa.array(chunk.ids, pa.int64())
        if all(type(i) is int for i in chunk.ids)
        else pa.array([str(i) for i in chunk.ids], pa.string())
    )
    table = pa.table(
        {
            "id": ids,
            "vector": pa.FixedSizeListArray.from_arrays(flat, width),
            "tokens": pa.array(chunk.tokens, pa.int32()),
            "row": pa.array(chunk.rows, pa.int64()),
        }
    )
    bad = json.dumps([b.as_dict() for b in chunk.bad]).encode()
    return table.replace_schema_metadata({BAD_KEY: bad})


def read_part(path: Path) -> pa.Table:
    """A finished chunk's table, as `part_table` made it, mapped from its file."""
    import pyarrow as pa

    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


def part_bad(path: Path) -> list[dict[str, Any]]:
    """A finished chunk's bad lines."""
    import pyarrow as pa

    metadata = pa.ipc.open_file(pa.memory_map(str(path))).schema.metadata or {}
    bad: list[dict[str, Any]] = json.loads(metadata.get(BAD_KEY, b"[]"))
    return bad


def write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as sink:
        sink.write(data)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(temporary, path)
