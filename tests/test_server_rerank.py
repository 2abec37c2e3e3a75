"""The scoring routes in this process: rerank as TEI, Cohere and infinity shape it, classify as
TEI's /predict and infinity's /classify, each equal to sentence-transformers' CrossEncoder,
and every bad request a 400 in the envelope."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.models import MINILM_NAME
from tests.support.server import InProcess, assert_envelope, in_process, metric

pytestmark = pytest.mark.anyio
QUERY = "Which animal purrs?"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide: the app below serves every test of the module


@pytest.fixture(scope="module")
async def served(
    tiny_classifiers: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[InProcess]:
    """MiniLM, a reranker and a classifier (three labels) in the catalog, without a pooling
    for the two that score; the reranker preloaded, so requests naming no model get it."""
    models = tmp_path_factory.mktemp("rerank") / "models.toml"
    models.write_text(
        f'[models.reranker]\nsource = "{tiny_classifiers["bert-1"]}"\n'
        f'[models.classifier]\nsource = "{tiny_classifiers["xlm-roberta-3"]}"\n'
    )
    settings = {"models_file": str(models), "preload": f"reranker,{MINILM_NAME}",
                "max_request_items": 64}  # fmt: skip
    async with in_process(settings) as app:
        yield app


def cross_encoder(directory: Path) -> Any:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(directory), device="cpu")


@pytest.fixture(scope="module")
def documents(reference_texts: list[str]) -> list[str]:
    return reference_texts[:12]


@pytest.fixture(scope="module")
def expected(tiny_classifiers: dict[str, Path], documents: list[str]) -> np.ndarray:
    scores: np.ndarray = cross_encoder(tiny_classifiers["bert-1"]).predict(
        [(QUERY, doc) for doc in documents]
    )
    return scores


def best_first(scores: np.ndarray) -> list[int]:
    return [int(i) for i in np.argsort(-scores, kind="stable")]


async def test_tei_rerank_names_no_model_and_returns_scores_best_first(
    served: InProcess, documents: list[str], expected: np.ndarray
) -> None:
    body = {"query": QUERY, "texts": documents, "return_text": True}
    response = await served.client.post("/rerank", json=body)
    assert response.status_code == 200, response.text
    ranked = response.json()
    assert [hit["index"] for hit in ranked] == best_first(expected)
    assert [hit["score"] for hit in ranked] == pytest.approx(sorted(expected)[::-1], abs=1e-5)
    assert [hit["text"] for hit in ranked] == [documents[hit["index"]] for hit in ranked]
    assert int(response.headers["x-total-tokens"]) > 0
    raw = (await served.client.post("/rerank", json={**body, "raw_scores": True})).json()
    logits = {hit["index"]: hit["score"] for hit in raw}
    sigmoid = {i: 1 / (1 + np.exp(-s)) for i, s in logits.items()}
    assert [sigmoid[i] for i in range(len(documents))] == pytest.approx(list(expected), abs=1e-5)


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
async def test_cohere_rerank_gives_the_top_n_with_their_documents(
    served: InProcess, documents: list[str], expected: np.ndarray, path: str
) -> None:
    objects = [{"text": doc} for doc in documents[:6]]  # Cohere's documents may be objects
    body = {"model": "reranker", "query": QUERY, "documents": [*objects, *documents[6:]],
            "top_n": 3, "return_documents": True}  # fmt: skip
    answer = (await served.client.post(path, json=body)).json()
    assert [r["index"] for r in answer["results"]] == best_first(expected)[:3]
    assert [r["document"] for r in answer["results"]] == [
        {"text": documents[i]} for i in best_first(expected)[:3]
    ]
    assert answer["results"][0]["relevance_score"] == pytest.approx(expected.max(), abs=1e-5)
    assert answer["model"] == "reranker"
    assert answer["meta"]["api_version"]["version"] == path[2]
    assert answer["usage"]["total_tokens"] > 0


async def test_infinitys_rerank_shape_at_its_path_sends_documents_as_text(
    served: InProcess, documents: list[str], expected: np.ndarray
) -> None:
    body = {"model": "default/not-specified", "query": QUERY, "documents": documents,
            "return_documents": True}  # fmt: skip
    answer = (await served.client.post("/rerank", json=body)).json()
    assert answer["object"] == "rerank"
    assert [r["index"] for r in answer["results"]] == best_first(expected)
    assert [r["document"] for r in answer["results"]] == [
        documents[i] for i in best_first(expected)
    ]


async def test_predict_and_classify_give_every_label_best_first(
    served: InProcess, tiny_classifiers: dict[str, Path], reference_texts: list[str]
) -> None:
    pair = [reference_texts[0], reference_texts[1]]
    softmax = cross_encoder(tiny_classifiers["xlm-roberta-3"]).predict(
        [tuple(pair)], apply_softmax=True
    )[0]
    labels = ("contradiction", "entailment", "neutral")
    one = await served.client.post("/predict", json={"model": "classifier", "inputs": pair})
    assert one.status_code == 200, one.text
    assert [s["label"] for s in one.json()] == [labels[i] for i in np.argsort(-softmax)]
    assert [s["score"] for s in one.json()] == pytest.approx(sorted(softmax)[::-1], abs=1e-5)
    many = await served.client.post(
        "/predict", json={"model": "classifier", "inputs": [pair, reference_texts[2]]}
    )
    assert len(many.json()) == 2
    assert [s["label"] for s in many.json()[0]] == [s["label"] for s in one.json()]
    assert [s["score"] for s in many.json()[0]] == pytest.approx([s["score"] for s in one.json()])
    texts = reference_texts[3:6]
    classified = await served.client.post(
        "/v1/classify", json={"model": "classifier", "input": texts}
    )
    answer = classified.json()
    assert answer["object"] == "classify"
    assert len(answer["data"]) == 3
    assert all(sum(s["score"] for s in row) == pytest.approx(1.0) for row in answer["data"])
    again = await served.client.post("/classify", json={"model": "classifier", "input": texts})
    assert again.json()["data"] == answer["data"]


BAD = [
    ("/v2/rerank", {"model": "reranker", "query": "", "documents": ["d"]}, "empty_input"),
    ("/v2/rerank", {"model": "reranker", "documents": ["d"]}, "empty_input"),
    ("/v2/rerank", {"model": "reranker", "query": "q", "documents": []}, "empty_input"),
    ("/v2/rerank", {"model": "reranker", "query": "q", "documents": "d"}, "invalid_input"),
    ("/v2/rerank", {"model": "reranker", "query": "q", "documents": [3]}, "invalid_input"),
    ("/v2/rerank", {"model": "reranker", "query": "q", "documents": [{"txt": "d"}]},
     "invalid_input"),
    ("/v2/rerank", {"model": "reranker", "query": "q", "documents": ["d"], "top_n": 0},
     "invalid_option"),
    ("/v2/rerank", {"model": "reranker", "query": "q", "documents": ["d"] * 65},
     "too_many_items"),
    ("/rerank", {"query": "q", "texts": [""]}, "invalid_input"),
    ("/predict", {"model": "classifier", "inputs": [["only one"]]}, "invalid_input"),
    ("/classify", {"model": "classifier", "input": []}, "empty_input"),
    ("/v2/rerank", {"model": "r\nx", "query": "q", "documents": ["d"]}, "invalid_option"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "code"), BAD)
async def test_a_bad_scoring_request_is_a_400_in_the_envelope(
    served: InProcess, path: str, body: dict[str, Any], code: str
) -> None:
    assert_envelope(await served.client.post(path, json=body), 400, code)


async def test_a_request_for_the_other_kind_of_model_says_which_route_serves_it(
    served: InProcess,
) -> None:
    embed = await served.client.post("/v1/embeddings", json={"model": "reranker", "input": "x"})
    error = assert_envelope(embed, 400, "wrong_model_task")
    assert "/v1/rerank" in error["message"]
    rerank = {"model": MINILM_NAME, "query": "q", "documents": ["d"]}
    error = assert_envelope(await served.client.post("/v2/rerank", json=rerank), 400,
                            "wrong_model_task")  # fmt: skip
    assert "/v1/embeddings" in error["message"]


async def test_an_over_long_pair_is_cut_unless_the_tei_caller_said_not_to(
    served: InProcess, reference_texts: list[str]
) -> None:
    long = " ".join(reference_texts * 3)  # thousands of tokens
    refused = await served.client.post("/rerank", json={"query": QUERY, "texts": [long]})
    assert_envelope(refused, 400, "context_length_exceeded")  # TEI's default: no truncate
    cut = await served.client.post("/rerank", json={"query": QUERY, "texts": [long],
                                                    "truncate": True})  # fmt: skip
    assert cut.status_code == 200
    cohere = {"model": "reranker", "query": QUERY, "documents": [long]}  # cut by default
    assert (await served.client.post("/v1/rerank", json=cohere)).status_code == 200


async def test_info_metrics_and_the_document_cover_the_scoring_routes(served: InProcess) -> None:
    await served.client.post("/v2/rerank", json={"model": "reranker", "query": "q",
                                                 "documents": ["d"]})  # fmt: skip
    models = (await served.client.get("/info")).json()["models"]
    reranker = next(m for m in models if m["model"] == "reranker")
    assert (reranker["task"], reranker["labels"], reranker["pooling"]) == (
        "score",
        ["relevance"],
        None,
    )
    metrics = (await served.client.get("/metrics")).text
    requests = metric(metrics, "embedx_requests_total", route="/v2/rerank", method="POST",
                      status="200")  # fmt: skip
    assert requests is not None
    assert requests >= 1
    paths = (await served.client.get("/openapi.json")).json()["paths"]
    for path in ("/rerank", "/v1/rerank", "/v2/rerank", "/predict", "/classify", "/v1/classify"):
        assert "400" in paths[path]["post"]["responses"], path
