"""TEI's per-route metric families (`te_embed_*`, `te_predict_*`) in /metrics, through the app
in this process: what each request to an embedding or a scoring route adds, input by input
as TEI counts them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.models import MINILM_NAME
from tests.support.server import InProcess, in_process, metric

pytestmark = pytest.mark.anyio
FAMILIES = ("te_embed_count", "te_embed_success", "te_predict_count", "te_predict_success")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide: the app below serves every test of the module


@pytest.fixture(scope="module")
async def served(
    tiny_classifiers: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[InProcess]:
    """MiniLM, and a tiny reranker in the catalog."""
    models = tmp_path_factory.mktemp("metrics") / "models.toml"
    models.write_text(f'[models.reranker]\nsource = "{tiny_classifiers["bert-1"]}"\n')
    settings = {"models_file": str(models), "preload": f"reranker,{MINILM_NAME}"}
    async with in_process(settings) as app:
        yield app


async def counts(served: InProcess) -> dict[str, float]:
    text = (await served.client.get("/metrics")).text
    return {name: metric(text, name) or 0.0 for name in FAMILIES}


async def test_embedding_routes_count_each_text_handed_to_the_model_and_answered(
    served: InProcess, reference_texts: list[str]
) -> None:
    before = await counts(served)
    client = served.client
    minilm = {"model": MINILM_NAME}
    answers = [
        await client.post("/embed", json={**minilm, "inputs": reference_texts[0]}),
        await client.post("/embed", json={**minilm, "inputs": reference_texts[1:4]}),
        await client.post("/v1/embeddings", json={**minilm, "input": reference_texts[4:6]}),
    ]
    # Not cut, too long for the model: handed to it, never answered (TEI's too)
    refused = await client.post("/embed", json={**minilm, "inputs": ["word " * 1000, "short"],
                                                "truncate": False})  # fmt: skip
    missing = await client.post("/embed", json={"model": "no-such-model", "inputs": "x"})
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert (refused.status_code, missing.status_code) == (400, 404)
    after = await counts(served)
    grown = {name: after[name] - before[name] for name in FAMILIES}
    # The missing model's text never reached a model: not counted
    assert grown == {"te_embed_count": 1 + 3 + 2 + 2, "te_embed_success": 1 + 3 + 2,
                     "te_predict_count": 0, "te_predict_success": 0}  # fmt: skip


async def test_scoring_routes_count_each_pair_or_text_handed_to_the_scorer_and_answered(
    served: InProcess, reference_texts: list[str]
) -> None:
    before = await counts(served)
    client = served.client
    reranked = await client.post(
        "/rerank", json={"model": "reranker", "query": "Which?", "texts": reference_texts[:3]}
    )
    cohere = await client.post(
        "/v2/rerank",
        json={"model": "reranker", "query": "Which?", "documents": reference_texts[3:5]},
    )
    predicted = await client.post("/predict", json={"model": "reranker", "inputs": "one text"})
    assert [r.status_code for r in (reranked, cohere, predicted)] == [200, 200, 200]
    after = await counts(served)
    grown = {name: after[name] - before[name] for name in FAMILIES}
    assert grown == {"te_embed_count": 0, "te_embed_success": 0,
                     "te_predict_count": 3 + 2 + 1, "te_predict_success": 3 + 2 + 1}  # fmt: skip


async def test_tei_route_families_are_tei_counters_without_labels(served: InProcess) -> None:
    text = (await served.client.get("/metrics")).text
    for name in FAMILIES:
        assert f"# TYPE {name} untyped\n" in text
        assert metric(text, name) is not None  # no labels, as TEI's
