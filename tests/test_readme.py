"""The README's snippets (and docs/api.md's reading of base64) run as written, against a real
server where they need one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.models import MINILM_NAME
from tests.support.server import running_server

pytestmark = pytest.mark.process  # each test starts a process of its own

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
API_DOCS = (ROOT / "docs" / "api.md").read_text()
# Run after the snippet that reads the body by hand: its rows are the ones the SDK makes
# floats of.
SAME_ROWS_AS_THE_SDK = """
floats = client.embeddings.create(
    model="sentence-transformers/all-MiniLM-L6-v2", input=["The quick brown fox", "A lazy dog"]
)
assert (vectors == [row.embedding for row in floats.data]).all()
"""


def blocks(language: str, text: str = README) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def test_the_library_example_runs_as_written() -> None:
    example = next(b for b in blocks("python") if "from embedx import Embedder" in b)
    done = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(2, 384) float32"


def test_the_curl_and_sdk_snippets_return_real_vectors(tmp_path: Path) -> None:
    curl = next(b for b in blocks("sh") if b.startswith("curl"))
    (sdk,) = (b for b in blocks("python") if "from openai import OpenAI" in b)
    (raw,) = (b for b in blocks("python", API_DOCS) if "with_raw_response" in b)
    with running_server(tmp_path, preload=MINILM_NAME) as server:
        port = server.url.rsplit(":", 1)[1]
        done = subprocess.run(
            ["sh", "-c", curl.replace("8477", port)], capture_output=True, text=True, timeout=120
        )
        if "not found" in done.stderr:
            pytest.skip("curl is not installed")
        assert '"object":"embedding"' in done.stdout
        sdk_run = run_python(sdk.replace("8477", port))
        raw_run = run_python(raw.replace("8477", port) + SAME_ROWS_AS_THE_SDK)
    assert sdk_run.returncode == 0, sdk_run.stderr
    assert sdk_run.stdout.strip() == "2 384"
    assert raw_run.returncode == 0, raw_run.stderr
    assert raw_run.stdout.strip() == "(2, 384)"


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
