"""Real rerank clients, unchanged but for the base URL, against a real server: Cohere's SDK (its
v2 client), LangChain's Cohere reranker, infinity's client (rerank and classify); and a client
that leaves."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.models import MINILM_NAME
from tests.support.server import Server, info, metric, running_server, until_embedding
from tests.support.waiting import eventually

pytestmark = pytest.mark.process  # each test starts a process of its own

QUERY = "Which animal purrs?"


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, tiny_classifiers: dict[str, Path]
) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("rerank-clients")
    models = directory / "models.toml"
    models.write_text(
        f'[models.reranker]\nsource = "{tiny_classifiers["bert-1"]}"\n'
        f'[models.classifier]\nsource = "{tiny_classifiers["bert-3"]}"\n'
    )
    with running_server(
        directory, models_file=models, preload=f"reranker,classifier,{MINILM_NAME}"
    ) as running:
        yield running


def cross_encoder_scores(directory: Path, pairs: list[tuple[str, str]]) -> Any:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(directory), device="cpu").predict(pairs)


def classified_by_transformers(directory: Path, texts: list[str]) -> Any:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    with torch.inference_mode():
        inputs = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        return torch.softmax(model(**inputs).logits, dim=1).numpy()


def test_the_cohere_sdks_v2_rerank_gets_the_cross_encoders_order(
    server: Server, tiny_classifiers: dict[str, Path], reference_texts: list[str]
) -> None:
    import cohere

    documents = reference_texts[:10]
    expected = cross_encoder_scores(tiny_classifiers["bert-1"], [(QUERY, d) for d in documents])
    client = cohere.ClientV2(api_key="unused", base_url=server.url)
    answer = client.rerank(model="reranker", query=QUERY, documents=documents, top_n=4)
    assert [r.index for r in answer.results] == [int(i) for i in np.argsort(-expected)[:4]]
    scores = [r.relevance_score for r in answer.results]
    assert scores == pytest.approx(sorted(expected)[::-1][:4], abs=1e-5)


def test_langchains_cohere_reranker_keeps_the_cross_encoders_best_documents(
    server: Server, tiny_classifiers: dict[str, Path], reference_texts: list[str]
) -> None:
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document
    from pydantic import SecretStr

    documents = reference_texts[:10]
    expected = cross_encoder_scores(tiny_classifiers["bert-1"], [(QUERY, d) for d in documents])
    key = SecretStr("unused")
    reranker = CohereRerank(cohere_api_key=key, base_url=server.url, model="reranker", top_n=3)
    kept = reranker.compress_documents(
        [Document(page_content=d, metadata={"at": i}) for i, d in enumerate(documents)], QUERY
    )
    assert [d.metadata["at"] for d in kept] == [int(i) for i in np.argsort(-expected)[:3]]
    scores = [d.metadata["relevance_score"] for d in kept]
    assert scores == pytest.approx(sorted(expected)[::-1][:3], abs=1e-5)


def test_infinitys_client_reranks_and_classifies(
    server: Server, tiny_classifiers: dict[str, Path], reference_texts: list[str]
) -> None:
    from infinity_client import Client
    from infinity_client.api.default import classify, rerank
    from infinity_client.models import ClassifyInput, ClassifyResult, RerankInput, ReRankResult

    client = Client(base_url=server.url)
    documents = reference_texts[:8]
    expected = cross_encoder_scores(tiny_classifiers["bert-1"], [(QUERY, d) for d in documents])
    ranked = rerank.sync(client=client, body=RerankInput(
        query=QUERY, documents=documents, model="reranker", return_documents=True))  # fmt: skip
    assert isinstance(ranked, ReRankResult)
    assert [r.index for r in ranked.results] == [int(i) for i in np.argsort(-expected)]
    assert [r.document for r in ranked.results] == [documents[r.index] for r in ranked.results]
    texts = reference_texts[8:11]
    softmax = classified_by_transformers(tiny_classifiers["bert-3"], texts)
    classified = classify.sync(client=client, body=ClassifyInput(input_=texts, model="classifier"))
    assert isinstance(classified, ClassifyResult)
    for row, scores in zip(classified.data, softmax, strict=True):
        assert [s.score for s in row] == pytest.approx(sorted(scores)[::-1], abs=1e-5)


def test_a_client_that_hangs_up_has_its_pairs_dropped(
    server: Server, reference_texts: list[str]
) -> None:
    # 2,000 pairs of the model's whole length: seconds of work on a CPU, even for a tiny model
    documents = [" ".join(reference_texts[i : i + 12]) for i in range(100)] * 20
    body = json.dumps({"model": "reranker", "query": QUERY, "documents": documents}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as leaving:
        leaving.sendall(b"POST /v2/rerank HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        until_embedding(server)
    eventually(lambda: not (info(server)["requests"]["running"] or _queued(server, "reranker")),
               message="the queue still holds the pairs of a client that left")  # fmt: skip
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "embedx_requests_total", route="/v2/rerank", method="POST",
                  status="499") == 1  # fmt: skip


def _queued(server: Server, name: str) -> int:
    model = next(m for m in info(server)["models"] if m["model"] == name)
    return int(model["queue"]["items"])
