"""The corpus job: every input format read alike, bad lines named, outputs equal to the library's
vectors, and a job killed at any point resumed to the one-shot result."""

from __future__ import annotations

import asyncio
import csv
import gzip
import io
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from embedx.config import load_settings
from embedx.errors import InvalidInput
from embedx.jobs import CorpusJob, command, run
from embedx.jobs.corpus import AHEAD, ChunkEmbedder
from embedx.jobs.inputs import Bad, Fields, Reader, Records, shards
from tests.support.corpus import DATA
from tests.support.waiting import eventually


@pytest.fixture(scope="module")
def corpus() -> list[dict[str, Any]]:
    """A hundred real texts with their ids: fortunes, Wikipedia, news, the Lee corpus, and
    one over the model's 256 tokens."""
    rows = []
    for name in ("reference_texts.jsonl", "lee50.jsonl"):
        with open(DATA / name) as lines:
            rows += [json.loads(line) for line in lines]
    chosen = [{"id": r["id"], "text": r["text"]} for r in rows[:80] + rows[-20:]]
    long = " ".join(r["text"] for r in rows[-3:])  # over the model's 256 tokens: cut to them
    return [*chosen, {"id": "long", "text": long}]


@pytest.fixture(scope="module")
def embedder(minilm_dir: Path) -> Iterator[ChunkEmbedder]:
    with ChunkEmbedder(minilm_dir, pooling="mean") as model:
        yield model


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@dataclass(frozen=True)
class Record:
    row: int
    id: str | int
    text: str


def records(*inputs: str | Path, fields: Fields | None = None) -> list[Record | Bad]:
    """What the inputs read as, a line at a time."""
    found: list[Record | Bad] = []
    for item in Reader(shards([str(i) for i in inputs]), fields or Fields()):
        if isinstance(item, Records):
            found += (
                Record(item.row + at, *line)
                for at, line in enumerate(zip(item.ids, item.texts, strict=True))
            )
        else:
            found.append(item)
    return found


def read_parquet(path: Path) -> tuple[list[Any], np.ndarray, list[int]]:
    table = pq.read_table(path)
    vectors = np.stack(table.column("vector").to_numpy(zero_copy_only=False))
    return table.column("id").to_pylist(), vectors, table.column("tokens").to_pylist()


def assert_same_vectors(found: np.ndarray, expected: np.ndarray) -> None:
    """Equal but for the last bits, which a batch's make-up moves: the job's chunks share the
    engine's batches, so a text is not batched with the same others as in another run."""
    assert found.shape == expected.shape
    np.testing.assert_allclose(found, expected, rtol=0, atol=1e-5)


# -- reading ---------------------------------------------------------------------------


@pytest.mark.parametrize("block_bytes", [256, 4 << 20])  # many blocks a file, or one
def test_every_format_and_compression_reads_as_the_same_records(
    tmp_path: Path, corpus: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    from embedx.jobs import blocks

    monkeypatch.setattr(blocks, "BLOCK_BYTES", block_bytes)
    rows = corpus[:40]
    jsonl = write_jsonl(tmp_path / "a.jsonl", rows).read_bytes()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(jsonl))
    (tmp_path / "a.ndjson.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet", row_group_size=7)
    with open(tmp_path / "a.csv", "w", newline="") as sink:
        writer = csv.DictWriter(sink, ["id", "text"])  # texts with newlines and quotes
        writer.writeheader()
        writer.writerows(rows)
    flat = [{"id": r["id"], "text": " ".join(r["text"].split())} for r in rows]
    with open(tmp_path / "a.tsv", "w") as sink:
        sink.write("text\tid\n" + "".join(f"{r['text']}\t{r['id']}\n" for r in flat))
    (tmp_path / "a.txt").write_text("".join(r["text"] + "\n" for r in flat))

    expected = [Record(i, r["id"], r["text"]) for i, r in enumerate(rows)]
    for name in ("a.jsonl", "a.jsonl.gz", "a.ndjson.zst", "a.parquet", "a.csv"):
        assert records(tmp_path / name) == expected, name
    assert records(tmp_path / "a.tsv") == [
        Record(i, r["id"], r["text"]) for i, r in enumerate(flat)
    ]
    assert records(tmp_path / "a.txt") == [Record(i, i, r["text"]) for i, r in enumerate(flat)]


def test_folders_and_globs_name_their_files_in_order_and_rows_count_across_them(
    tmp_path: Path,
) -> None:
    shards_dir = tmp_path / "shards"
    shards_dir.mkdir()
    for n in (2, 0, 1):
        write_jsonl(shards_dir / f"part-{n}.jsonl", [{"text": f"text {n}.{i}"} for i in range(3)])
    (shards_dir / "_SUCCESS").write_text("")
    (shards_dir / ".hidden.jsonl").write_text("not json")
    from_folder = records(shards_dir)
    assert [r.text for r in from_folder if isinstance(r, Record)] == [
        f"text {n}.{i}" for n in range(3) for i in range(3)
    ]
    assert [r.id for r in from_folder if isinstance(r, Record)] == list(range(9))  # row numbers
    assert records(str(shards_dir / "part-*.jsonl")) == from_folder
    with pytest.raises(InvalidInput, match="matches no file"):
        shards([str(tmp_path / "nothing-*.jsonl")])
    with pytest.raises(InvalidInput, match="does not exist"):
        shards([str(tmp_path / "absent.jsonl")])


def test_each_bad_line_is_named_by_its_file_and_line(tmp_path: Path) -> None:
    lines = [
        '{"text": "fine", "id": "a"}',
        "",  # blank: no record, no error
        '{"body": "no text field"}',
        '{"text": 7}',
        '{"text": ""}',
        '{"text": "fine", "id": [1]}',
        '{"text": "cut off',
        '["not", "an object"]',
        '{"text": "\\ud800 a lone surrogate"}',
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes("\n".join(lines).encode() + b"\n\xff\xfe\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "lines.txt").write_text("one\n  \nthree\n")
    (tmp_path / "short.csv").write_text('text,id\n"a, b",1\nonly one field,2,extra\n')

    found = records(path, tmp_path / "empty.jsonl", tmp_path / "lines.txt", tmp_path / "short.csv")
    bad = {(Path(b.file).name, b.line): b.error for b in found if isinstance(b, Bad)}
    assert bad == {
        ("bad.jsonl", 3): "has no field 'text'",
        ("bad.jsonl", 4): "field 'text' is a number, not a string",
        ("bad.jsonl", 5): "field 'text' is empty",
        ("bad.jsonl", 6): "field 'id' is an array, not a string or an integer",
        ("bad.jsonl", 7): "is not JSON: Unterminated string starting at, column 10",
        ("bad.jsonl", 8): "is an array, not a JSON object",
        ("bad.jsonl", 9): "field 'text' is not valid Unicode (bytes that were not UTF-8?)",
        ("bad.jsonl", 10): "is not valid UTF-8 (byte 1)",
        ("empty.jsonl", None): "the file is empty: it holds no texts",
        ("lines.txt", 2): "is blank: each line is a text",
        ("short.csv", 3): "has 3 fields where the header has 2",
    }
    good = [r for r in found if isinstance(r, Record)]
    assert [(r.text, r.id) for r in good] == [
        ("fine", "a"), ("one", 9), ("three", 11), ("a, b", "1")
    ]  # fmt: skip


def test_a_column_the_file_lacks_is_one_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("body,id\nhello,1\n")
    with pytest.raises(InvalidInput, match=r"a\.csv, line 1: the header has no column 'text'"):
        records(tmp_path / "a.csv")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "a.parquet")
    with pytest.raises(InvalidInput, match=r"no column 'text' \(its columns: body\)"):
        records(tmp_path / "a.parquet")
    assert records(tmp_path / "a.csv", fields=Fields("body")) == [Record(0, "1", "hello")]


# Lines the bulk readers pass to the line-by-line one (bad, or needing a closer look), each
# read in the middle of good lines: a line reads alike whichever reads it.
ODD_JSONL = [
    b'{"text": "two"}{"text": "on one line"}',
    b'{"text":\n"over two lines"}',
    b'\xef\xbb\xbf{"text": "a byte-order mark past the first line"}',
    b'{"text": "invalid UTF-8 in a field not read", "note": "\xff"}',
    b'{"text": "a lone surrogate in a field not read", "note": "\\udc00"}',
    b'{"text": "a field twice", "text": "the last one counts"}',
    b'{"text": "an empty id", "id": ""}',
    b'{"text": "a null id", "id": null}',
    b'{"text": "a string id", "id": "doc-1"}',
    b'{"text": "a fractional id", "id": 1.5}',
    b'{"text": "a boolean id", "id": true}',
    b'{"text": "an id past 64 bits", "id": 123456789012345678901234567890}',
    b'{"text": "NaN", "id": NaN}',
    b'{"text": ""}',
    b'{"text": null}',
    b'{"text": 5}',
    b'{"no": "text"}',
    b"  \t",
    b"",
    b'{"text": "a\\u2028line separator, a \\r carriage return"}',
]
ODD_TEXT = [b"  \t", b"", b"\xef\xbb\xbfa mark", b"\xff\xfe", b"a\rcarriage", "a\u2028b".encode()]


@pytest.mark.parametrize("block_bytes", [64, 4 << 20])
def test_a_block_read_in_bulk_reads_as_its_lines_do_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    from embedx.jobs import blocks, inputs

    monkeypatch.setattr(blocks, "BLOCK_BYTES", block_bytes)
    good = [json.dumps({"text": f"good line {i}", "id": i}).encode() for i in range(4)]
    files = []
    for number, odd in enumerate(ODD_JSONL):
        files.append(tmp_path / f"{number}.jsonl")
        files[-1].write_bytes(b"\n".join([*good[:2], odd, *good[2:]]) + b"\n")
    for number, odd in enumerate(ODD_TEXT):
        files.append(tmp_path / f"{number}.txt")
        files[-1].write_bytes(b"\r\n".join([b"first", odd, b"last"]))  # no newline at the end
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(good) + b"\r\n")
    files.append(tmp_path / "bom.jsonl")

    fields = (Fields(), Fields("text", "text"))  # each text its own id, too
    in_bulk = {(f.name, n): records(f, fields=fields[n]) for f in files for n in (0, 1)}
    monkeypatch.setattr(inputs, "jsonl_columns", lambda *args: None)
    monkeypatch.setattr(inputs, "text_lines", lambda *args: None)
    for f in files:
        for n in (0, 1):
            assert in_bulk[f.name, n] == records(f, fields=fields[n]), f.read_bytes()
    assert [r.text for r in in_bulk["bom.jsonl", 0]] == [f"good line {i}" for i in range(4)]  # type: ignore[union-attr]


def test_clean_files_are_read_in_bulk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corpus: list[dict[str, Any]]
) -> None:
    from embedx.jobs.inputs import Reader

    def refused(*args: Any) -> None:
        raise AssertionError("read line by line")

    for slow in ("_jsonl_lines", "_text_lines", "_record"):
        monkeypatch.setattr(Reader, slow, refused)
    write_jsonl(tmp_path / "a.jsonl", corpus)
    write_jsonl(tmp_path / "b.jsonl", [{"text": r["text"]} for r in corpus])  # no ids
    (tmp_path / "a.txt").write_text("".join(" ".join(r["text"].split()) + "\n" for r in corpus))
    pq.write_table(pa.Table.from_pylist(corpus), tmp_path / "a.parquet")
    found = records(*(tmp_path / n for n in ("a.jsonl", "b.jsonl", "a.txt", "a.parquet")))
    assert len(found) == 4 * len(corpus)
    assert [r.id for r in found[len(corpus) : 2 * len(corpus)]] == [  # type: ignore[union-attr]
        *range(len(corpus), 2 * len(corpus))
    ]


def test_a_parquet_batch_of_odd_values_reads_as_its_rows_do_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedx.jobs import inputs

    tables = {
        "null text": pa.table({"text": ["a", None, "c"]}),
        "empty text": pa.table({"text": ["a", "", "c"]}),
        "empty and null ids": pa.table({"text": ["a", "b", "c"], "id": ["x", "", None]}),
        "fractional ids": pa.table({"text": ["a", "b"], "id": [1.0, 2.5]}),
        "unsigned ids": pa.table({"text": ["a", "b"], "id": pa.array([1, 2], pa.uint8())}),
        "null ids": pa.table({"text": ["a", "b"], "id": pa.nulls(2)}),
    }
    for name, table in tables.items():
        pq.write_table(table, tmp_path / f"{name}.parquet")
    in_bulk = {name: records(tmp_path / f"{name}.parquet") for name in tables}
    monkeypatch.setattr(inputs, "arrow_columns", lambda *args: None)
    for name in tables:
        assert in_bulk[name] == records(tmp_path / f"{name}.parquet"), name


# -- embedding -------------------------------------------------------------------------


def test_the_job_writes_the_library_vectors_bit_for_bit_with_ids_and_token_counts(
    tmp_path: Path, corpus: list[dict[str, Any]], embedder: ChunkEmbedder, minilm_dir: Path
) -> None:
    from tokenizers import Tokenizer

    source = write_jsonl(tmp_path / "in.jsonl", corpus)
    output = tmp_path / "out.parquet"
    stream = io.StringIO()
    summary = run(CorpusJob("minilm", [str(source)], output), load_settings({}), stream, embedder)
    assert stream.getvalue() == ""  # not a terminal: no bar
    assert summary.startswith(f"embedx: embedded {len(corpus)} texts (")
    ids, vectors, tokens = read_parquet(output)
    texts = [r["text"] for r in corpus]
    assert ids == [r["id"] for r in corpus]
    assert vectors.dtype == np.float32
    assert np.array_equal(vectors, embedder.embed(texts))
    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)
    assert tokens == [len(e.ids) for e in tokenizer.encode_batch(texts)]
    assert tokens[-1] == 256
    assert not (tmp_path / "out.parquet.parts").exists()
    assert not (tmp_path / "out.parquet.bad.jsonl").exists()


def test_npy_and_safetensors_hold_the_parquet_rows(
    tmp_path: Path, corpus: list[dict[str, Any]], embedder: ChunkEmbedder
) -> None:
    from safetensors.numpy import load_file

    source = write_jsonl(tmp_path / "in.jsonl", corpus[:60])
    outputs = {}
    for name in ("out.parquet", "out.npy", "out.safetensors"):
        job = CorpusJob("minilm", [str(source)], tmp_path / name, chunk_texts=25, dimensions=128)
        run(job, load_settings({}), io.StringIO(), embedder)
        outputs[name] = tmp_path / name
    _, vectors, tokens = read_parquet(outputs["out.parquet"])
    assert vectors.shape == (60, 128)
    assert_same_vectors(np.load(outputs["out.npy"]), vectors)
    tensors = load_file(outputs["out.safetensors"])
    assert_same_vectors(tensors["vectors"], vectors)
    assert tensors["tokens"].tolist() == tokens
    assert tensors["rows"].tolist() == list(range(60))


def test_a_parquet_output_is_written_as_chunks_finish_and_mixed_ids_are_joined(
    tmp_path: Path,
    corpus: list[dict[str, Any]],
    embedder: ChunkEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No join copies every vector again at the end; a later chunk whose ids are strings
    where the first's were numbers stops the stream, and the parts are joined as ids of one
    type, strings."""
    from embedx.jobs import corpus as corpus_module
    from embedx.jobs.results import join

    rows = [{"id": i, "text": r["text"]} for i, r in enumerate(corpus[:40])]
    joined: list[Path] = []

    def counted(parts: list[Path], *args: Any) -> int:
        joined.append(args[0])
        return join(parts, *args)

    monkeypatch.setattr(corpus_module, "join", counted)
    numbers = tmp_path / "numbers.parquet"
    job = CorpusJob("minilm", [str(write_jsonl(tmp_path / "n.jsonl", rows))], numbers,
                    chunk_texts=15)  # fmt: skip
    run(job, load_settings({}), io.StringIO(), embedder)
    assert joined == []  # streamed
    ids, vectors, _ = read_parquet(numbers)
    assert ids == list(range(40))
    assert_same_vectors(vectors, embedder.embed([r["text"] for r in rows]))
    mixed = [*rows[:20], *({"id": f"doc-{r['id']}", "text": r["text"]} for r in rows[20:])]
    output = tmp_path / "mixed.parquet"
    job = CorpusJob("minilm", [str(write_jsonl(tmp_path / "m.jsonl", mixed))], output,
                    chunk_texts=15)  # fmt: skip
    run(job, load_settings({}), io.StringIO(), embedder)
    assert joined == [output]
    ids, mixed_vectors, _ = read_parquet(output)
    assert ids == [str(r["id"]) for r in mixed]
    assert_same_vectors(mixed_vectors, vectors)
    assert not (tmp_path / "mixed.parquet.parts").exists()


def test_the_next_chunks_wait_in_the_engine_while_it_embeds_one_and_come_out_in_order(
    tmp_path: Path,
    corpus: list[dict[str, Any]],
    embedder: ChunkEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At a chunk's end the devices go on to the next, already queued: the first chunk is held
    in the engine until the AHEAD chunks sent behind it are back, and its rows still come
    first; no more than AHEAD + 1 chunks are ever in the engine."""
    engine = embedder._engine
    embed = engine.embed
    in_engine: list[int] = []  # how many chunks, each time one arrives
    back = 0
    behind_are_back = asyncio.Event()

    async def held(texts: Any, options: Any) -> Any:
        nonlocal back
        first = not in_engine
        in_engine.append(in_engine[-1] + 1 if in_engine else 1)
        try:
            if first:
                await asyncio.wait_for(behind_are_back.wait(), 120)  # never, one at a time
            return await embed(texts, options)
        finally:
            in_engine.append(in_engine[-1] - 1)
            back += not first
            if back == AHEAD:
                behind_are_back.set()

    monkeypatch.setattr(engine, "embed", held)
    rows = corpus[:40]
    output = tmp_path / "out.parquet"
    job = CorpusJob("minilm", [str(write_jsonl(tmp_path / "in.jsonl", rows))], output,
                    chunk_texts=4)  # fmt: skip
    run(job, load_settings({}), io.StringIO(), embedder)
    assert max(in_engine) == AHEAD + 1
    ids, vectors, _ = read_parquet(output)
    assert ids == [r["id"] for r in rows]
    monkeypatch.undo()
    assert_same_vectors(vectors, embedder.embed([r["text"] for r in rows]))


def test_a_bad_line_stops_the_job_with_one_message_and_skip_bad_lists_it(
    tmp_path: Path, corpus: list[dict[str, Any]], embedder: ChunkEmbedder
) -> None:
    rows: list[dict[str, Any]] = [*corpus[:30]]
    rows[12] = {"id": "broken", "body": "no text"}
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.parquet"
    stream = io.StringIO()
    job = CorpusJob("minilm", [str(source)], output, chunk_texts=10)
    with pytest.raises(InvalidInput, match=re.escape("in.jsonl, line 13: has no field 'text'")):
        run(job, load_settings({}), stream, embedder)
    assert not output.exists()
    skipping = CorpusJob("minilm", [str(source)], output, chunk_texts=10, skip_bad=True)
    summary = run(skipping, load_settings({}), stream, embedder)  # resumes: chunk 0 was done
    assert "1 bad lines skipped" in summary
    assert "(1 chunks were done by an earlier run)" in summary
    ids, vectors, _ = read_parquet(output)
    assert ids == [r["id"] for r in rows if "text" in r]
    assert_same_vectors(vectors, embedder.embed([r["text"] for r in rows if "text" in r]))
    side = [
        json.loads(line) for line in (tmp_path / "out.parquet.bad.jsonl").read_text().splitlines()
    ]
    assert side == [{"file": str(source), "line": 13, "row": 12, "error": "has no field 'text'"}]


def test_a_work_folder_of_other_inputs_is_refused_not_mixed_in(
    tmp_path: Path, corpus: list[dict[str, Any]], embedder: ChunkEmbedder
) -> None:
    rows: list[dict[str, Any]] = [*corpus[:6], {"text": None}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    job = CorpusJob("minilm", [str(source)], tmp_path / "out.parquet", chunk_texts=4)
    bad = "in.jsonl, line 7: field 'text' is null, not a string"
    with pytest.raises(InvalidInput, match=re.escape(bad)):
        run(job, load_settings({}), io.StringIO(), embedder)  # its first chunk is kept
    write_jsonl(source, corpus[:7])  # the input fixed: the kept chunk is of the old one
    stream = io.StringIO()
    assert command(job, load_settings({}), stream) == 1
    assert stream.getvalue().splitlines() == [
        f"embedx: {tmp_path / 'out.parquet.parts'} holds the parts of another job (its "
        "inputs differ from this one's): remove that folder to start this job over"
    ]


def test_a_work_folder_of_another_chunk_size_says_how_to_resume_it(
    tmp_path: Path, corpus: list[dict[str, Any]], embedder: ChunkEmbedder
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [*corpus[:6], {"text": None}, *corpus[6:9]])
    output = tmp_path / "out.parquet"
    with pytest.raises(InvalidInput, match="line 7"):  # its first chunk is kept
        run(CorpusJob("minilm", [str(source)], output, chunk_texts=4), load_settings({}),
            io.StringIO(), embedder)  # fmt: skip
    stream = io.StringIO()
    other = CorpusJob("minilm", [str(source)], output, chunk_texts=5, skip_bad=True)
    assert command(other, load_settings({}), stream) == 1
    assert stream.getvalue().splitlines() == [
        f"embedx: {tmp_path / 'out.parquet.parts'} holds the parts of another job (its "
        "chunk_texts differ from this one's): remove that folder to start this job over; "
        "--chunk-texts 4 resumes it"
    ]
    manifest = tmp_path / "out.parquet.parts" / "manifest.json"
    held = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({k: v for k, v in held.items() if k != "chunk_texts"}))
    stream = io.StringIO()
    assert command(other, load_settings({}), stream) == 1  # a folder that names no size
    assert stream.getvalue().splitlines() == [
        f"embedx: {tmp_path / 'out.parquet.parts'} holds the parts of another job (its "
        "chunk_texts differ from this one's): remove that folder to start this job over"
    ]
    manifest.write_text(json.dumps(held))
    resumed = CorpusJob("minilm", [str(source)], output, chunk_texts=4, skip_bad=True)
    run(resumed, load_settings({}), io.StringIO(), embedder)
    assert pq.read_table(output).num_rows == 9


def test_the_bar_shows_texts_tokens_and_rate_on_a_terminal() -> None:
    from embedx.jobs.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    clock = iter([0.0, 1.0, 2.0, 3.0, 4.0])
    progress = Progress(1000, terminal, clock=lambda: next(clock))
    progress.advance(500, 20, 4000)
    progress.close()
    assert "50%" in terminal.getvalue()
    assert "20 texts, 4,000 tokens, 4.00k tokens/s" in terminal.getvalue()


# -- stopping and resuming -------------------------------------------------------------


def start_job(source: Path, output: Path, minilm_dir: Path) -> subprocess.Popen[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDX_")}
    environment["HF_HUB_OFFLINE"] = "1"
    arguments = [str(minilm_dir), str(source), "-o", str(output), "--pooling", "mean"]
    return subprocess.Popen(
        [sys.executable, "-m", "embedx", "embed", *arguments, "--chunk-texts", "8"],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(ready: Callable[[], bool], process: subprocess.Popen[str]) -> None:
    """Until `ready()`, while the job runs: a job that ended first fails with its output."""

    def running_until_ready() -> bool:
        assert process.poll() is None, process.communicate()
        return ready()

    eventually(running_until_ready, within=300)


def wait_for_parts(parts: Path, count: int, process: subprocess.Popen[str]) -> None:
    wait_for(lambda: len(list(parts.glob("chunk-*.arrow"))) >= count, process)


@pytest.mark.process
@pytest.mark.slow  # four runs, each loading the model
def test_a_job_killed_or_stopped_resumes_to_the_one_shot_result_each_row_once(
    tmp_path: Path, corpus: list[dict[str, Any]], embedder: ChunkEmbedder, minilm_dir: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", corpus[:96])
    one_shot = tmp_path / "one-shot.parquet"
    job = CorpusJob("minilm", [str(source)], one_shot, chunk_texts=8)
    run(job, load_settings({}), io.StringIO(), embedder)

    output = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    loading = start_job(source, output, minilm_dir)  # the manifest is written before the load
    wait_for((parts / "manifest.json").exists, loading)
    loading.send_signal(signal.SIGKILL)
    loading.communicate(timeout=60)

    killed = start_job(source, output, minilm_dir)
    wait_for_parts(parts, 2, killed)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    assert (parts / "manifest.json").exists()

    stopped = start_job(source, output, minilm_dir)
    done_before = len(list(parts.glob("chunk-*.arrow")))
    wait_for_parts(parts, done_before + 3, stopped)
    stopped.send_signal(signal.SIGTERM)
    _, errors = stopped.communicate(timeout=60)
    assert stopped.returncode == 128 + signal.SIGTERM, errors
    assert errors.strip().splitlines()[-1] == (
        f"embedx: stopped by SIGTERM: the finished chunks are in {parts}; the same command resumes"
    )
    assert not output.exists()

    finished = start_job(source, output, minilm_dir)
    _, errors = finished.communicate(timeout=300)
    assert finished.returncode == 0, errors
    assert "chunks were done by an earlier run" in errors
    ids, vectors, tokens = read_parquet(output)
    expected_ids, expected_vectors, expected_tokens = read_parquet(one_shot)
    assert ids == expected_ids == [r["id"] for r in corpus[:96]]
    assert_same_vectors(vectors, expected_vectors)
    assert tokens == expected_tokens
    assert not parts.exists()


def test_the_bench_measures_the_job_against_the_library_and_its_stages(tmp_path: Path) -> None:
    out = tmp_path / "corpus.json"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDX_")}
    arguments = ["bert-base", "--tiny", "--corpus", str(DATA / "lee50.jsonl"), "--runs", "1"]
    done = subprocess.run(
        [sys.executable, str(DATA.parent.parent / "bench" / "corpus.py"), *arguments,
         "--repeat", "1", "--limit", "40", "--chunk-texts", "16", "--device-rate", "1e6",
         "--out", str(out)],
        env={**environment, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["texts"] == 40
    assert result["job"]["tokens_per_s"] > 0
    assert result["job_share_of_library"] > 0
    assert len(result["job_share_by_turn"]) == 1
    stages = result["job_stages_s"]
    assert set(stages) == {"first_s", "embed_s", "last_s", "read_s", "part_s", "output_s"}
    assert stages["embed_s"] > 0
