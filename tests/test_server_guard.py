"""The guard, in this process: a request's id and access line, 404 and 405, the API key, CORS,
and the one place where anything unexpected becomes a plain 500 whose traceback is logged."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import openai
import pytest

from embedx.server import app as app_module
from tests.support.models import MINILM_NAME
from tests.support.server import InProcess, assert_envelope, in_process, sdk

pytestmark = pytest.mark.anyio
KEY = "s3cret"
APP = "https://app.example.com"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide: the apps below serve every test of the module


@pytest.fixture(scope="module")
async def plain() -> AsyncIterator[InProcess]:
    async with in_process() as app:
        yield app


@pytest.fixture(scope="module")
async def keyed() -> AsyncIterator[InProcess]:
    """A server with an API key, which a browser page on APP may call."""
    async with in_process({"api_key": KEY, "cors_allow_origins": APP}) as app:
        yield app


async def test_every_request_leaves_an_access_line_with_its_id(
    plain: InProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="embedx.access")
    served = await plain.client.get("/v1/models")
    refused = await plain.client.post("/v1/embeddings", json={"model": MINILM_NAME})  # a 400
    lines = [r.getMessage() for r in caplog.records if r.name == "embedx.access"]
    (line,) = [line for line in lines if f"id={served.headers['x-request-id']}" in line]
    assert line.startswith("GET /v1/models 200 ")
    (line,) = [line for line in lines if f"id={refused.headers['x-request-id']}" in line]
    assert line.startswith("POST /v1/embeddings 400 ")
    assert line.endswith(" code=empty_input")  # what to grep for
    # a client's (or proxy's) own id is kept, so that both logs name the request alike
    for given, kept in (("client-42/a.b", True), ("two words", False), ("x" * 129, False)):
        response = await plain.client.get("/health", headers={"x-request-id": given})
        assert (response.headers["x-request-id"] == given) is kept, given


async def test_unknown_route_is_a_404_and_wrong_method_a_405(plain: InProcess) -> None:
    client = plain.client
    assert_envelope(await client.get("/v2/embeddings"), 404, "not_found")
    response = await client.get("/v1/embeddings")
    assert_envelope(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"
    response = await client.post("/health", json={})
    assert_envelope(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET, HEAD"
    assert (await client.get("/")).json()["status"] == "ok"  # TEI's health check there too


async def test_an_api_key_guards_every_route_but_health(keyed: InProcess) -> None:
    client = keyed.client
    missing = await client.get("/info")
    assert_envelope(missing, 401, "invalid_api_key")
    assert missing.headers["www-authenticate"].startswith("Bearer")
    wrong = await client.get("/info", headers={"Authorization": "Bearer nope"})
    assert_envelope(wrong, 401, "invalid_api_key")
    assert (await client.get("/health")).status_code == 200
    lower = await client.get("/info", headers={"Authorization": f"bearer {KEY}"})
    assert lower.status_code == 200  # the scheme is case-insensitive
    assert KEY not in lower.text
    basic = await client.get("/info", headers={"Authorization": f"Basic {KEY}"})
    assert "Bearer" in assert_envelope(basic, 401, "invalid_api_key")["message"]
    async with sdk(keyed.app, "nope") as wrong_key:
        with pytest.raises(openai.AuthenticationError):
            await wrong_key.embeddings.create(model=MINILM_NAME, input="x")
    async with sdk(keyed.app, KEY) as right_key:
        ok = await right_key.embeddings.create(model=MINILM_NAME, input="x")
    assert len(ok.data[0].embedding) == 384


async def test_a_page_on_an_allowed_origin_gets_cors_answers(keyed: InProcess) -> None:
    client = keyed.client
    asking = {"Origin": APP, "Access-Control-Request-Method": "POST",
              "Access-Control-Request-Headers": "authorization, content-type"}  # fmt: skip
    preflight = await client.options("/v1/embeddings", headers=asking)  # no key
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == APP
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
    assert preflight.headers["vary"] == "origin"

    body = {"model": MINILM_NAME, "input": "x"}
    keyed_post = {"Origin": APP, "Authorization": f"Bearer {KEY}"}
    ok = await client.post("/v1/embeddings", json=body, headers=keyed_post)
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == APP
    assert "x-total-tokens" in ok.headers["access-control-expose-headers"]
    refused = await client.post("/v1/embeddings", json=body, headers={"Origin": APP})
    assert_envelope(refused, 401, "invalid_api_key")  # and the page can read why:
    assert refused.headers["access-control-allow-origin"] == APP

    other_page = "https://other.example.com"
    elsewhere = {**asking, "Origin": other_page}
    assert (await client.options("/v1/embeddings", headers=elsewhere)).status_code != 204
    other = await client.post(
        "/v1/embeddings", json=body, headers={**keyed_post, "Origin": other_page}
    )
    assert other.status_code == 200
    assert "access-control-allow-origin" not in other.headers


async def test_without_allowed_origins_no_cors_headers_are_sent(plain: InProcess) -> None:
    response = await plain.client.get("/v1/models", headers={"Origin": APP})
    assert response.status_code == 200
    assert not [name for name in response.headers if name.startswith("access-control-")]


async def test_a_bug_in_a_route_is_a_500_naming_the_request_id_that_its_log_line_has(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(state: object, http: object) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(
        app_module,
        "ROUTES",
        tuple((m, p, broken if p == "/v1/models" else h) for m, p, h in app_module.ROUTES),
    )
    async with in_process() as app:
        response = await app.client.get("/v1/models")
    request_id = response.headers["x-request-id"]
    error = assert_envelope(response, 500, "internal_bug")
    assert request_id in error["message"]
    assert "injected" not in response.text  # the log has it, the client not
    (logged,) = [r for r in caplog.records if r.exc_info]  # one guard, one traceback
    assert request_id in logged.getMessage()
