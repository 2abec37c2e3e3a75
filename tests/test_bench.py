"""The benchmarks behind the README's figures still run: each on tiny random shapes, on CPU,
over the test corpus. Their rates mean nothing here; that they finish and write every
figure does (a change to the settings once broke `throughput.py` on the GPU host only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.process  # each test starts a process of its own

ROOT = Path(__file__).resolve().parent.parent
CORPUS = str(ROOT / "tests" / "data" / "lee50.jsonl")


def _bench(script: str, *args: str, out: Path) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("EMBEDX_DEVICES", None)  # devices found, as on the GPU host
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_throughput_measures_every_method(tmp_path: Path) -> None:
    result = _bench(
        "throughput.py",
        "bert-base",
        "--tiny",
        "--corpus",
        CORPUS,
        "--repeat",
        "1",
        "--runs",
        "1",
        "--reference-sample",
        "16",
        "--peer-fraction",
        "0.5",
        out=tmp_path / "throughput.json",
    )
    methods = result["methods"]
    assert set(methods) == {
        "tokenize_only",
        "embedx",
        "transformers_sorted",
        "sentence_transformers",
    }
    assert all(m["tokens_per_s"] > 0 for m in methods.values())
    assert result["accuracy_vs_float32"]["min_cosine"] > 0.999


@pytest.mark.parametrize("decoding", ["sdk", "body"])
def test_load_measures_server_and_library(tmp_path: Path, decoding: str) -> None:
    result = _bench(
        "load.py",
        "--decoding",
        decoding,
        "--model",
        "bert-base",
        "--tiny",
        "--clients",
        "4",
        "--client-processes",
        "2",
        "--requests",
        "8",
        "--batch",
        "16",
        "--passes",
        "1",
        "--corpus",
        CORPUS,
        out=tmp_path / "load.json",
    )
    # both embedded the same texts: 8 requests of 16
    assert result["server"]["tokens"] == result["library"]["tokens"] > 0
    assert result["server_vs_library"] > 0
    assert result["decoded_by"].startswith({"sdk": "the SDK", "body": "orjson"}[decoding])


def test_abuse_measures_long_texts_slow_bodies_and_large_bodies(tmp_path: Path) -> None:
    result = _bench(
        "abuse.py",
        "--text-mb",
        "0.1",
        "--slow-clients",
        "20",
        "--bodies",
        "2",
        "--body-mb",
        "1",
        "--log",
        str(tmp_path / "server.log"),
        out=tmp_path / "abuse.json",
    )
    assert result["long_text"][0]["status"] == 200
    slow = result["slow_bodies"]
    assert slow["one_text_requests_meanwhile"]["answered"] == 5
    assert slow["slow_sockets_answers_within_30_s"] == {"408": 20}
    assert slow["slow_sockets_answers_at_stop"] == {"503": 20}
    assert result["large_bodies"][0]["answered_with_every_vector"] == 2


def test_online_measures_small_requests_at_each_client_count(tmp_path: Path) -> None:
    result = _bench(
        "online.py",
        "bert-base",
        "--tiny",
        "--corpus",
        CORPUS,
        "--sizes",
        "1",
        "8",
        "--clients",
        "1",
        "3",
        "--client-processes",
        "2",
        "--warmup",
        "0.2",
        "--seconds",
        "0.5",
        "--bulk-texts",
        "8",
        "--bulk-clients",
        "2",
        "--library-batch-tokens",
        "4096",
        out=tmp_path / "online.json",
    )
    points = result["methods"]["embedx"]
    assert [(p["texts_per_request"], p["clients"]) for p in points] == [
        (1, 1),
        (1, 3),
        (8, 1),
        (8, 3),
    ]
    assert all(p["requests_per_s"] > 0 and 0 < p["p50_ms"] <= p["p99_ms"] for p in points)
    # the server's CPU a request: its event loop's share of the whole process's
    cpu = [(p["server_main_thread_us_per_request"], p["server_cpu_us_per_request"]) for p in points]
    assert all(0 <= loop <= whole for loop, whole in cpu)
    assert any(loop > 0 for loop, _ in cpu)
    assert 15 <= result["tokens_per_text"] <= 30  # 15 words a text
    bulk = result["bulk"]
    assert bulk["server"]["texts_per_request"] == 8
    assert bulk["server"]["tokens_per_s"] > 0
    assert bulk["library"]["max_batch_tokens"] == 4096
    assert bulk["library"]["tokens_per_s"] > 0
    assert bulk["server_over_library"] > 0


def test_outputs_measures_every_form_against_float(tmp_path: Path) -> None:
    result = _bench(
        "outputs.py",
        "--tiny",
        "--m3-shape",
        "bert-base",
        "--corpus",
        CORPUS,
        "--repeat",
        "1",
        "--limit",
        "12",
        "--runs",
        "1",
        out=tmp_path / "outputs.json",
    )
    assert set(result["minilm"]["trials"]) == {"float", "base64", "int8", "binary"}
    assert set(result["splade"]["trials"]) == {"float", "sparse", "sparse_top_k",
                                               "sparse_whole_rows"}  # fmt: skip
    assert set(result["m3"]["trials"]) == {"float", "int8", "binary", "sparse", "dense_sparse",
                                           "colbert"}  # fmt: skip
    assert 0 < result["splade"]["nonzeros_per_text"] < result["splade"]["vocabulary"] / 10
    for group in ("minilm", "splade", "m3"):
        trials = result[group]["trials"]
        assert trials["float"]["to_float"] == 1.0
        assert all(t["tokens_per_s"] > 0 and t["to_float"] > 0 for t in trials.values())
        assert all(len(t["deliver_s"]) == 1 for t in trials.values())
