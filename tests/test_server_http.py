"""`embedx serve` over real HTTP, one server for the module: the OpenAI SDK, TEI's client and
curl as users run them, and what granian and the RSGI bridge do with what clients send (long
responses, chunked bodies, HTTP/2, odd targets and paths, a client hanging up, the log)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import numpy as np
import openai
import pytest

from embedx import Embedder
from tests.support.models import MINILM_NAME
from tests.support.server import (
    Server,
    assert_envelope,
    client,
    info,
    metric,
    post,
    running_server,
    serve_environment,
    until_embedding,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.process  # each test starts a process of its own


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
def embedder() -> Iterator[Embedder]:
    """The library, in this process, with the server's settings: the same request gives the
    same batches, so the same bits."""
    with Embedder(MINILM_NAME) as library:
        yield library


# -- clients, unchanged ----------------------------------------------------------------------


def test_openai_sdk_default_base64_equals_the_library_bit_for_bit(
    server: Server, reference_texts: list[str], embedder: Embedder
) -> None:
    texts = reference_texts[:100]  # a few batches' worth, each side
    response = client(server).embeddings.create(model=MINILM_NAME, input=texts)
    vectors = np.array([d.embedding for d in response.data], dtype=np.float32)
    assert [d.index for d in response.data] == list(range(len(texts)))
    assert np.array_equal(vectors, embedder.embed(texts))
    assert response.usage.prompt_tokens == response.usage.total_tokens > len(texts)
    assert response.model == MINILM_NAME


def test_openai_sdk_float_equals_the_library_bit_for_bit(
    server: Server, reference_texts: list[str], embedder: Embedder
) -> None:
    texts = reference_texts[:50]
    response = client(server).embeddings.create(
        model=MINILM_NAME, input=texts, encoding_format="float"
    )
    vectors = np.array([d.embedding for d in response.data], dtype=np.float32)
    assert np.array_equal(vectors, embedder.embed(texts))


def test_a_base_url_without_v1_as_infinity_serves_works_unchanged(
    server: Server, reference_texts: list[str], embedder: Embedder
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
    server: Server, embedder: Embedder, reference_texts: list[str]
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


def test_the_sdk_lists_and_retrieves_models_slash_and_all(server: Server) -> None:
    models = client(server).models.list()
    minilm = next(m for m in models.data if m.id == MINILM_NAME)
    assert minilm.model_extra is not None
    assert minilm.model_extra["resident"] is True
    assert minilm.model_extra["pooling"] == "mean"
    model = client(server).models.retrieve(MINILM_NAME)  # the SDK percent-encodes the slash
    assert model.id == MINILM_NAME
    assert model.model_extra is not None
    assert model.model_extra["dimensions"] == 384
    typed = httpx.get(f"{server.url}/v1/models/{MINILM_NAME}")  # as curl sends it
    assert typed.status_code == 200
    assert typed.json() == model.model_dump(exclude_unset=True)


def test_the_sdk_gets_its_own_errors_for_unknown_models_and_names(server: Server) -> None:
    sdk = client(server)
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("org/no-such-model")
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("my model")
    with pytest.raises(openai.NotFoundError):  # an SDK left at its default model
        sdk.embeddings.create(model="text-embedding-3-small", input="x")


def test_a_pooling_conflict_is_a_409_the_sdk_does_not_retry(server: Server) -> None:
    sent: list[object] = []
    counted = openai.DefaultHttpxClient(event_hooks={"request": [sent.append]})
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", http_client=counted)
    with pytest.raises(openai.ConflictError):  # the SDK retries a 409 twice unless told not to
        sdk.embeddings.create(model=MINILM_NAME, input="x", extra_body={"pooling": "cls"})
    assert len(sent) == 1


def test_curl_gets_real_vectors(
    server: Server, embedder: Embedder, reference_texts: list[str]
) -> None:
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


def test_teis_own_client_gets_the_preloaded_model_at_embed_and_at_the_root(
    server: Server, embedder: Embedder, reference_texts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # it refuses even 127.0.0.1 offline
    alone = embedder.embed(reference_texts[:1])[0]
    for url in (f"{server.url}/embed", server.url):  # TEI serves its task at / too
        tei = InferenceClient(model=url)
        assert np.array_equal(tei.feature_extraction(reference_texts[0])[0], alone)


# -- what granian and the bridge make of it ------------------------------------------------------


def test_a_long_response_keeps_its_content_length(
    server: Server, reference_texts: list[str]
) -> None:
    body = {"model": MINILM_NAME, "input": reference_texts[:100], "encoding_format": "base64"}
    response = post(server, "/v1/embeddings", json=body)
    assert len(response.content) > 61440  # longer than BlackSheep sends in one piece
    assert int(response.headers["content-length"]) == len(response.content)
    assert "transfer-encoding" not in response.headers
    assert len(response.json()["data"]) == 100


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


def test_a_chunked_body_is_read_whole(
    server: Server, embedder: Embedder, reference_texts: list[str]
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


def test_http2_is_not_spoken(server: Server) -> None:
    """Over HTTP/2 a body needs no declared length, and one that is not chunked is read in
    one call, before the size limit could stop it: HTTP/1.1 only."""
    with httpx.Client(http1=False, http2=True) as speaking_h2, pytest.raises(httpx.TransportError):
        speaking_h2.get(server.url + "/health")
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_request_target_that_is_no_path_is_a_400_not_a_500(server: Server) -> None:
    logged = len(server.output())  # the module's server: others' lines came before
    for target in ("CONNECT example.com:443", "POST 127.0.0.1:80", "GET example.com:80"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as raw:
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
    """The bridge quotes again the path granian decoded: BlackSheep parses the raw one."""
    for path in ("/v1/models/a%20b", "/v1/models/%C3%BC", "/nope%C3%BC", "/%ff", "/v1/models/%00"):
        assert_envelope(httpx.get(server.url + path), 404, "model_not_found" if "models" in path
                        else "not_found")  # fmt: skip
    forged = "/nope%0A2026-12-01 00:00:00,000 INFO embedx.access: FORGED"
    response = httpx.get(server.url + forged)
    assert_envelope(response, 404, "not_found")
    server.wait_for_output(f"id={response.headers['x-request-id']}")
    forged_lines = [line for line in server.output().splitlines() if "FORGED" in line]
    assert forged_lines, "no access line for the request"
    assert forged_lines == [
        line for line in server.output().splitlines() if "GET /nope\\x0a2026" in line
    ], "a path's newline began a log line of its own"


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
    for answer in answers:
        server.wait_for_output(f"id={answer.headers['x-request-id']}")
    written = server.output()[before:]
    assert not any(line.startswith(FORGED) for line in written.splitlines())
    assert "\x1b" not in written
    assert len(written) < 64_000  # 330 KB of names, a few lines of log


def test_a_client_that_hangs_up_has_its_texts_dropped(
    server: Server, reference_texts: list[str]
) -> None:
    texts = [f"{text} {text}" for text in reference_texts]  # seconds of work on a CPU
    body = json.dumps({"model": MINILM_NAME, "input": texts}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as leaving:
        leaving.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        until_embedding(server)
    eventually(lambda: not (info(server)["requests"]["running"] or _queued(server)),
               message="the queue still holds the texts of a client that left")  # fmt: skip
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "embedx_requests_total", route="/v1/embeddings", method="POST",
                  status="499") == 1  # fmt: skip
    assert metric(text, "embedx_request_errors_total", route="/v1/embeddings", status="499",
                  code="other") is None  # fmt: skip


def _queued(server: Server) -> int:
    model = next(m for m in info(server)["models"] if m["model"] == MINILM_NAME)
    return int(model["queue"]["items"])


def test_a_taken_port_stops_the_start_before_any_model_loads(server: Server) -> None:
    env = serve_environment(port=server.port, preload=MINILM_NAME)  # another embedx has it
    second = subprocess.run([sys.executable, "-m", "embedx", "serve"], env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert second.returncode == 1
    assert f"cannot listen on 127.0.0.1:{server.port}" in second.stderr
    assert "EMBEDX_PORT" in second.stderr
    assert f"loaded {MINILM_NAME}" not in second.stderr  # said before loading, not after
    assert httpx.get(server.url + "/health").status_code == 200  # the first one is untouched
