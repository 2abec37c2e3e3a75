"""A corpus job's inputs read as one stream: the files an INPUT names, each opened as its
format and compression say, as runs of good lines (read in bulk where clean: `blocks`) and the
bad lines between them."""

from __future__ import annotations

import csv
import glob
import gzip
import io
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from embedx.errors import InvalidInput
from embedx.jobs.blocks import (
    BOM,
    Ids,
    arrow_columns,
    blocks,
    jsonl_columns,
    line_count,
    text_lines,
)

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
PARQUET_BATCH = 8192
csv.field_size_limit(2**31 - 1)  # a text may be longer than the module's 128 KiB default


@dataclass(frozen=True, slots=True)
class Fields:
    text: str = "text"
    id: str = "id"


@dataclass(frozen=True, slots=True)
class Shard:
    """One input file: its path, format and compression."""

    path: Path
    format: str
    compression: str | None

    def identity(self) -> dict[str, Any]:
        """What says the file is the one a job began on."""
        stat = self.path.stat()
        return {
            "path": str(self.path.resolve()),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
        }


@dataclass(slots=True)
class Records:
    """A run of good lines: rows `row`, `row + 1`, ... (a row is a line's place among every
    line of the inputs, bad ones included), each line's id (the id field's value, else its
    row) and text."""

    row: int
    ids: list[str | int]
    texts: list[str]


Line = tuple[int, str | int, str]  # a good line read on its own: its row, id and text
RUN_LINES = 4096  # good lines read one by one, gathered into one run


@dataclass(slots=True)
class Bad:
    file: str
    line: int | None  # None: the whole file (an empty one)
    row: int | None
    error: str

    def message(self) -> str:
        where = self.file if self.line is None else f"{self.file}, line {self.line}"
        return f"{where}: {self.error}"

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "row": self.row, "error": self.error}


def shards(inputs: Sequence[str]) -> list[Shard]:
    """The files INPUT arguments name: files, folders (their files, sorted by name, hidden ones
    and Spark's `_SUCCESS` left out) and globs (sorted), in the order given."""
    paths: list[Path] = []
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if p.is_file() and p.name[0] not in "._")
            if not inside:
                raise InvalidInput(f"input folder {given} holds no files")
            paths.extend(inside)
        elif path.is_file():
            paths.append(path)
        elif glob.has_magic(given):
            matched = sorted(Path(p) for p in glob.glob(given) if os.path.isfile(p))
            if not matched:
                raise InvalidInput(f"input {given!r} matches no file")
            paths.extend(matched)
        else:
            raise InvalidInput(f"input {given} does not exist")
    return [shard_of(p) for p in paths]


def shard_of(path: Path) -> Shard:
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes.pop()
    fmt = FORMATS.get(suffixes[-1], "text") if suffixes else "text"
    if fmt == "parquet" and compression:
        raise InvalidInput(f"{path}: a Parquet file compresses itself; give it uncompressed")
    return Shard(path, fmt, compression)


class Reader:
    """The runs of good lines and the bad lines of every shard, in order; `position` is how
    many of their bytes (as stored) have been read, for the progress bar."""

    def __init__(self, files: Sequence[Shard], fields: Fields) -> None:
        self.files = files
        self.fields = fields
        self.total_bytes = sum(f.path.stat().st_size for f in files)
        self._done_bytes = 0  # the finished files'
        self._tell: Callable[[], int] | None = None  # the open file's bytes read, if it tells
        self._file_bytes = 0  # else how far into the open file, as last known
        self._row = 0

    @property
    def position(self) -> int:
        """Worked out when asked for, not at each line: a file's `tell` is a system call."""
        return self._done_bytes + (self._tell() if self._tell is not None else self._file_bytes)

    def __iter__(self) -> Iterator[Records | Bad]:
        read = {"jsonl": self._jsonl, "csv": self._csv, "tsv": self._csv, "text": self._text}
        for shard in self.files:
            if shard.format == "parquet":
                yield from self._gathered(shard, self._parquet(shard))
            else:
                with open(shard.path, "rb") as raw:
                    self._tell = raw.tell
                    try:
                        yield from self._gathered(shard, read[shard.format](shard, raw))
                    finally:
                        self._tell = None
            self._done_bytes += shard.path.stat().st_size
            self._file_bytes = 0

    def _gathered(
        self, shard: Shard, lines: Iterator[Line | Records | Bad]
    ) -> Iterator[Records | Bad]:
        """A file's runs and bad lines, its good lines read one by one gathered into runs; a
        note for a file with none."""
        run: Records | None = None
        empty = True
        for line in lines:
            empty = False
            if type(line) is tuple:
                if run is None:
                    run = Records(line[0], [], [])
                run.ids.append(line[1])
                run.texts.append(line[2])
                if len(run.texts) == RUN_LINES:
                    yield run
                    run = None
            else:
                if run is not None:
                    yield run
                    run = None
                yield line  # type: ignore[misc]  # Records or Bad
        if run is not None:
            yield run
        if empty:
            yield Bad(str(shard.path), None, None, "the file is empty: it holds no texts")

    def _next_row(self) -> int:
        row = self._row
        self._row += 1
        return row

    def _run(self, texts: list[str], ids: Ids) -> Records:
        """Good lines' texts and ids (None: the row stands in)."""
        row = self._row
        self._row += len(texts)
        if ids is None:
            ids = list(range(row, self._row))
        elif None in ids:
            ids = [row + at if i is None else i for at, i in enumerate(ids)]
        return Records(row, ids, texts)  # type: ignore[arg-type]  # no None is left

    def _record(self, shard: Shard, line: int, text: object, id_: object) -> Line | Bad:
        """One line, checked."""
        row = self._next_row()
        problem = text_problem(self.fields.text, text)
        if problem is None:
            if id_ is None or id_ == "":
                return row, row, text  # type: ignore[return-value]  # checked above
            if type(id_) is int or (isinstance(id_, str) and valid_unicode(id_)):
                return row, id_, text  # type: ignore[return-value]
            problem = f"field {self.fields.id!r} is {kind(id_)}, not a string or an integer"
        return Bad(str(shard.path), line, row, problem)

    def _bad(self, shard: Shard, line: int, error: str) -> Bad:
        return Bad(str(shard.path), line, self._next_row(), error)

    def _jsonl(self, shard: Shard, raw: IO[bytes]) -> Iterator[Line | Records | Bad]:
        text, id_ = self.fields.text, self.fields.id
        return self._blocks(
            shard,
            raw,
            lambda block, first: jsonl_columns(block, first, text, id_),
            self._jsonl_lines,
        )

    def _blocks(
        self,
        shard: Shard,
        raw: IO[bytes],
        in_bulk: Callable[[bytes, bool], tuple[list[str], Ids] | None],
        one_by_one: Callable[[Shard, IO[bytes], int], Iterator[Line | Records | Bad]],
    ) -> Iterator[Line | Records | Bad]:
        """A text file's blocks, each read in bulk or, where that says None, line by line."""
        number = 1  # the block's first line's
        for block in blocks(open_bytes(shard, raw)):
            read = in_bulk(block, number == 1)
            if read is not None:
                yield self._run(*read)
            else:
                yield from one_by_one(shard, io.BytesIO(block), number)
            number += line_count(block)

    def _jsonl_lines(
        self, shard: Shard, lines: IO[bytes], first: int
    ) -> Iterator[Line | Records | Bad]:
        """A JSONL block line by line, its first line the file's line `first`."""
        for number, line in enumerate(lines, first):
            if number == 1:
                line = line.removeprefix(BOM)
            if not line.strip():
                continue  # a blank line (a file's last, say) holds no record
            try:
                # orjson: an eighth of the json module's time, under the interpreter lock that
                # the engine's thread needs too; what it refuses, the json module reads or names
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                pass
            else:
                yield self._object(shard, number, value)
                continue
            try:
                value = json.loads(line.rstrip(b"\r\n").decode())
            except UnicodeDecodeError as exc:
                yield self._bad(shard, number, f"is not valid UTF-8 (byte {exc.start + 1})")
                continue
            except json.JSONDecodeError as exc:
                yield self._bad(shard, number, f"is not JSON: {exc.msg}, column {exc.colno}")
                continue
            except RecursionError:
                yield self._bad(shard, number, "is not JSON we read: nested too deep")
                continue
            yield self._object(shard, number, value)

    def _object(self, shard: Shard, line: int, value: object) -> Line | Bad:
        """A JSONL line's value."""
        if not isinstance(value, dict):
            return self._bad(shard, line, f"is {kind(value)}, not a JSON object")
        if self.fields.text not in value:
            return self._bad(shard, line, f"has no field {self.fields.text!r}")
        return self._record(shard, line, value[self.fields.text], value.get(self.fields.id))

    def _text(self, shard: Shard, raw: IO[bytes]) -> Iterator[Line | Records | Bad]:
        return self._blocks(shard, raw, text_lines, self._text_lines)

    def _text_lines(
        self, shard: Shard, lines: IO[bytes], first: int
    ) -> Iterator[Line | Records | Bad]:
        """A text block line by line, its first line the file's line `first`."""
        for number, line in enumerate(lines, first):
            line = line.removesuffix(b"\n").removesuffix(b"\r")
            if number == 1:
                line = line.removeprefix(BOM)
            try:
                text = line.decode()
            except UnicodeDecodeError as exc:
                yield self._bad(shard, number, f"is not valid UTF-8 (byte {exc.start + 1})")
                continue
            if not text.strip():
                yield self._bad(shard, number, "is blank: each line is a text")
            else:
                row = self._next_row()
                yield row, row, text

    def _csv(self, shard: Shard, raw: IO[bytes]) -> Iterator[Line | Records | Bad]:
        stream = io.TextIOWrapper(
            open_bytes(shard, raw), encoding="utf-8-sig", errors="surrogateescape", newline=""
        )
        tabs = shard.format == "tsv"  # IANA's TSV: no quoting, a field holds no tab or newline
        rows = csv.reader(stream, delimiter="\t" if tabs else ",",
                          quoting=csv.QUOTE_NONE if tabs else csv.QUOTE_MINIMAL)  # fmt: skip
        header = next(rows, None)
        if header is None:
            return
        if self.fields.text not in header:
            raise InvalidInput(
                f"{shard.path}, line 1: the header has no column {self.fields.text!r} (its "
                f"columns: {', '.join(header)[:200]}); --text-field names the column"
            )
        text_at = header.index(self.fields.text)
        id_at = header.index(self.fields.id) if self.fields.id in header else None
        line = rows.line_num + 1
        while True:
            try:
                fields = next(rows)
            except StopIteration:
                return
            except csv.Error as exc:
                yield self._bad(shard, line, f"is not {shard.format.upper()} ({exc})")
                line = rows.line_num + 1
                continue
            if len(fields) != len(header):
                yield self._bad(
                    shard, line, f"has {len(fields)} fields where the header has {len(header)}"
                )
            else:
                ident = fields[id_at] if id_at is not None else None
                yield self._record(shard, line, fields[text_at], ident)
            line = rows.line_num + 1

    def _parquet(self, shard: Shard) -> Iterator[Line | Records | Bad]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.ParquetFile(shard.path)
        except (pa.ArrowException, OSError) as exc:
            raise InvalidInput(f"{shard.path}: not a Parquet file ({exc})") from None
        schema = table.schema_arrow
        if self.fields.text not in schema.names:
            raise InvalidInput(
                f"{shard.path}: no column {self.fields.text!r} (its columns: "
                f"{', '.join(schema.names)[:200]}); --text-field names the column"
            )
        columns = [self.fields.text]
        text_type = schema.field(self.fields.text).type
        if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
            raise InvalidInput(
                f"{shard.path}: column {self.fields.text!r} holds {text_type}, not strings"
            )
        if self.fields.id in schema.names:
            columns.append(self.fields.id)
        size = shard.path.stat().st_size
        total = max(table.metadata.num_rows, 1)
        done = 0
        for batch in table.iter_batches(batch_size=PARQUET_BATCH, columns=columns):
            if not batch.num_rows:
                continue
            read = arrow_columns(batch.column(0), batch.column(1) if len(columns) > 1 else None)
            if read is not None:
                yield self._run(*read)
            else:
                texts = batch.column(0).to_pylist()
                ids = batch.column(1).to_pylist() if len(columns) > 1 else [None] * len(texts)
                for offset, (text, ident) in enumerate(zip(texts, ids, strict=True)):
                    yield self._record(shard, done + offset + 1, text, ident)
            done += batch.num_rows
            self._file_bytes = size * done // total


def open_bytes(shard: Shard, raw: IO[bytes]) -> IO[bytes]:
    """The file's bytes as stored, decompressed."""
    if shard.compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if shard.compression == "zstd":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(reader)
    return raw


def text_problem(field: str, text: object) -> str | None:
    """Why `text` cannot be embedded, or None."""
    if not isinstance(text, str):
        return f"field {field!r} is {kind(text)}, not a string"
    if not text:
        return f"field {field!r} is empty"
    if not valid_unicode(text):
        return f"field {field!r} is not valid Unicode (bytes that were not UTF-8?)"
    return None


def valid_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def kind(value: object) -> str:
    """A JSON value's kind, as a person would say it."""
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "an array", dict: "an object"}  # fmt: skip
    return names.get(type(value), f"a {type(value).__name__}")
