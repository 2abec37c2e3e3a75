from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import environment, run_embedx
from tests.support.waiting import eventually


@pytest.mark.process
def test_info_prints_settings_and_devices_without_loading_a_model() -> None:
    done = run_embedx("info", "--json", "--max-batch-tokens", "4096")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["settings"]["max_batch_tokens"] == 4096
    assert shown["settings"]["api_key"] == "unset"
    assert shown["devices"][0]["device"] == "cpu"
    text = run_embedx("info").stdout
    assert "devices (fastest first" in text
    assert "max_batch_tokens" in text


@pytest.mark.process
def test_a_bad_setting_exits_with_code_2_and_names_it() -> None:
    done = run_embedx("info", env={"EMBEDX_PORT": "-1"})
    assert done.returncode == 2
    assert "port" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.process
def test_embed_prints_one_vector_per_text() -> None:
    done = run_embedx("embed", "sentence-transformers/all-MiniLM-L6-v2", "hello", "world")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rows) == 2
    assert len(rows[0]) == 384


@pytest.mark.process
def test_embed_reads_a_text_a_line_from_stdin_and_refuses_blank_lines() -> None:
    model = "sentence-transformers/all-MiniLM-L6-v2"
    done = run_embedx("embed", model, stdin="one\ntwo\n")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2
    # dropping the blank lines would pair the output's lines with the wrong texts
    refused = run_embedx("embed", model, stdin="one\n\ntwo\n   \nthree")
    assert refused.returncode == 1
    assert "[2, 4]" in refused.stderr
    assert refused.stdout == ""


def test_stdin_from_a_windows_file_gives_its_texts() -> None:
    """A byte-order mark and CRLF line ends are the file's, not its texts' (MiniLM's tokenizer
    drops both; a SentencePiece one would not)."""
    from embedx.cli import stdin_texts

    assert stdin_texts(io.StringIO("\ufeffone\r\ntwo \r\nthree", newline="")) == [
        "one",
        "two ",
        "three",
    ]


@pytest.mark.process
def test_output_to_a_reader_that_left_is_no_traceback() -> None:
    for args in (("info", "--json"), ("embed", "sentence-transformers/all-MiniLM-L6-v2", "x")):
        process = subprocess.Popen([sys.executable, "-m", "embedx", *args], env=environment(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert process.stdout is not None
        process.stdout.close()  # as `| head` does once it has read enough
        _, errors = process.communicate(timeout=120)
        assert process.returncode == 0, errors
        assert b"Traceback" not in errors, errors
        assert b"BrokenPipe" not in errors, errors


@pytest.mark.process
def test_embed_without_a_pooling_names_the_flag(minilm_dir: Path) -> None:
    done = run_embedx("embed", str(minilm_dir), "hello")
    assert done.returncode == 1
    assert "--pooling" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.process
def test_a_model_that_cannot_be_built_is_one_line_not_a_traceback(
    minilm_dir: Path, tmp_path: Path
) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (tmp_path / name).write_bytes((minilm_dir / name).read_bytes())
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')  # no sizes
    (tmp_path / "model.safetensors").write_bytes(b"")
    done = run_embedx("embed", str(tmp_path), "--pooling", "mean", "hi")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"embedx: model {str(tmp_path)!r} could not be built from its files (KeyError: "
        "'vocab_size'); check its config.json and weights"
    ]


@pytest.mark.process
@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("sentence_bert_config.json", '{"max_seq_length": "long"}', "cannot read (ValueError"),
        ("modules.json", '["Transformer"]', "cannot read (AttributeError"),
        ("tokenizer.json", '{"model": {}}', "could not be built from its files"),
    ],
)
def test_a_model_file_of_the_wrong_shape_is_one_line_naming_the_model(
    minilm_dir: Path, tmp_path: Path, name: str, content: str, said: str
) -> None:
    """Not a 500 in the server, nor a traceback here: the model's fault, said as such."""
    for original in minilm_dir.iterdir():
        if original.is_file():
            (tmp_path / original.name).symlink_to(original)
    (tmp_path / name).unlink(missing_ok=True)
    (tmp_path / name).write_text(content)
    done = run_embedx("embed", str(tmp_path), "--pooling", "mean", "hi")
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert str(tmp_path) in done.stderr
    assert said in done.stderr


# Marks, in the file EMBEDDING_MARK names, that Embedder.embed was called: the model loaded.
MARK_EMBEDDING = """
import os
from embedx import embedder
embed = embedder.Embedder.embed
def marked(self, *args, **kwargs):
    open(os.environ["EMBEDDING_MARK"], "w").close()
    return embed(self, *args, **kwargs)
embedder.Embedder.embed = marked
"""


@pytest.mark.process
def test_ctrl_c_during_an_embed_ends_it_with_one_line_and_exit_130(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(MARK_EMBEDDING)
    mark = tmp_path / "embedding"
    texts = "\n".join(f"text {i} " + "many words in a long line " * 30 for i in range(20000))
    embedding = subprocess.Popen(
        [sys.executable, "-m", "embedx", "embed", "sentence-transformers/all-MiniLM-L6-v2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(PYTHONPATH=str(tmp_path), EMBEDDING_MARK=str(mark)),
        # a shell's background job starts with SIGINT ignored, and Python keeps that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert embedding.stdin is not None
        assert embedding.stderr is not None
        embedding.stdin.write(texts)
        embedding.stdin.close()
        # past the model's load, embedding the texts: minutes of work on two cores
        eventually(lambda: mark.exists() or embedding.poll() is not None)
        assert embedding.poll() is None, embedding.stderr.read()
        embedding.send_signal(signal.SIGINT)
        assert embedding.wait(timeout=120) == 130
        assert embedding.stderr.read().strip() == "embedx: interrupted"
    finally:  # failed, it would embed on for minutes beside the rest of the suite
        embedding.kill()
        embedding.wait()


@pytest.mark.process
def test_embed_takes_texts_after_its_flags_and_refuses_unknown_flags() -> None:
    model = "sentence-transformers/all-MiniLM-L6-v2"
    done = run_embedx("embed", model, "--pooling", "mean", "hello", "world")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2
    refused = run_embedx("embed", model, "hello", "--no-such-flag")
    assert refused.returncode == 2
    assert "--no-such-flag" in refused.stderr


@pytest.mark.process
def test_serve_without_the_server_packages_says_which_extra_to_install() -> None:
    blocked = "import sys; sys.modules['blacksheep'] = None; from embedx.cli import main; "
    result = subprocess.run([sys.executable, "-c", blocked + "sys.exit(main(['serve']))"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "embedx: serving needs the server's packages (blacksheep is missing): "
        'pip install "embedx-inference[server]"'
    )
