"""A corpus job's inputs read in bulk where they are clean: a text file a block of lines at a
time, JSONL through Arrow's JSON reader (which parses off the interpreter lock that the
engine's and the tokenizer's threads need: read line by line with orjson, the reader held 14%
of it in a MiniLM job on an H100), plain text by one decode, Parquet a batch of columns at a
time. A block that is not clean (a bad line, a value that needs a closer look) is None here;
the caller reads it line by line, naming each bad line, so a line reads alike either way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    import pyarrow as pa

BLOCK_BYTES = 4 << 20
BOM = b"\xef\xbb\xbf"
# Each line's id, None where the field is absent, null or "": its row stands in. Not a
# list at all (None): every line's row stands in.
Ids = list[str | int | None] | None


def blocks(stream: IO[bytes]) -> Iterator[bytes]:
    """The stream's bytes in blocks of whole lines, about BLOCK_BYTES each."""
    while block := stream.read(BLOCK_BYTES):
        if not block.endswith(b"\n"):
            block += stream.readline()
        yield block


def line_count(block: bytes) -> int:
    return block.count(b"\n") + (not block.endswith(b"\n"))


def jsonl_columns(block: bytes, first: bool, text: str, id_: str) -> tuple[list[str], Ids] | None:
    """A JSONL block's texts and ids, where each of its lines is one JSON object with a
    non-empty string text and an integer or string id (or none); else None. `first`: the
    block begins its file (where a byte-order mark is the file's)."""
    import pyarrow as pa
    import pyarrow.json as pj

    if not (block.isascii() or _utf8(block)):  # Arrow checks only the fields it keeps
        return None
    if not first and block.startswith(BOM):
        return None  # Arrow would take it as a file's
    columns = [(text, pa.string())] + ([(id_, _id_type(block, id_))] if id_ != text else [])
    schema = pa.schema(columns)
    # one thread, the reader's: the tokenizer's workers have the other cores
    reading = pj.ReadOptions(use_threads=False, block_size=min(len(block), 2**31 - 1))
    parsing = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = pj.read_json(pa.BufferReader(block), reading, parsing)
    except (pa.ArrowException, UnicodeDecodeError):
        return None
    # Arrow reads objects, not lines: two on one line, or one over two, are bad lines here.
    # (Both in one block, evenly, would pass: no corpus writer makes such a file.)
    if table.num_rows != line_count(block) and table.num_rows != _filled_lines(block):
        return None
    return arrow_columns(table.column(text), table.column(id_))


def arrow_columns(
    texts: pa.ChunkedArray | pa.Array, ids: pa.ChunkedArray | pa.Array | None
) -> tuple[list[str], Ids] | None:
    """Arrow columns as a block's texts and ids; None where a text is missing or empty or an
    id is neither a string nor an integer."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if texts.null_count or (len(texts) and pc.min(pc.binary_length(texts)).as_py() == 0):
        return None
    if ids is None or pa.types.is_null(ids.type):
        return texts.to_pylist(), None
    if pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type):
        ids = pc.if_else(pc.equal(ids, ""), pa.scalar(None, ids.type), ids)
    elif not pa.types.is_integer(ids.type):
        return None
    return texts.to_pylist(), ids.to_pylist()


def text_lines(block: bytes, first: bool) -> tuple[list[str], Ids] | None:
    """A plain text block's lines (and no ids), where each is UTF-8 and not blank; else
    None."""
    try:
        text = block.decode()
    except UnicodeDecodeError:
        return None
    if first:
        text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    if not lines[-1]:
        lines.pop()  # after the block's last newline
    if "\r" in text:
        lines = [line.removesuffix("\r") for line in lines]
    return (lines, None) if all(map(str.strip, lines)) else None


def _id_type(block: bytes, id_: str) -> pa.DataType:
    """The id column's type, as the block's first line has it: Arrow reads a column as one type
    (a block of both is read line by line)."""
    import pyarrow as pa

    try:
        first = orjson.loads(block[: block.find(b"\n")] if b"\n" in block else block)
    except orjson.JSONDecodeError:
        return pa.int64()
    strings = isinstance(first, dict) and isinstance(first.get(id_), str)
    return pa.string() if strings else pa.int64()


def _utf8(block: bytes) -> bool:
    try:
        block.decode()
    except UnicodeDecodeError:
        return False
    return True


def _filled_lines(block: bytes) -> int:
    """Lines that are not blank (line by line, a blank line is skipped)."""
    return sum(1 for line in block.split(b"\n") if line.strip())
