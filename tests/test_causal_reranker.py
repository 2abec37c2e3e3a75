"""A Qwen3-Reranker-style causal-LM CrossEncoder (the softmax of its "yes" and "no" logits after
the chat template's render of a pair): what it is for read from its saved modules, its pairs
rendered and cut, and its scores, through the library and the rerank routes, equal to
sentence-transformers' CrossEncoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedx import Reranker
from embedx.errors import InputTooLong, InvalidInput, InvalidModel
from embedx.models.chat_pairs import ChatPairTokenizer
from embedx.models.source import resolve
from embedx.models.task import LogitScore, task_of
from tests.support.models import build_tiny_causal_reranker
from tests.support.server import assert_envelope, in_process

LENGTH = 400  # the saved CrossEncoder's max_length: pairs of long documents are cut
INSTRUCTION = "Given a question, find the passage that answers it"


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory, reference_texts: list[str]) -> Path:
    return build_tiny_causal_reranker(tmp_path_factory.mktemp("causal"), reference_texts, LENGTH)


@pytest.fixture(scope="module")
def reference(reranker_dir: Path) -> Any:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(reranker_dir), device="cpu")


@pytest.fixture(scope="module")
def pairs(reference_texts: list[str]) -> list[tuple[str, str]]:
    """Short pairs, and pairs far over the length (a long document, then a long query)."""
    long = " ".join(reference_texts[:30])
    short = [(reference_texts[0], doc) for doc in reference_texts[1:20]]
    return [*short, (reference_texts[1], long), (long, reference_texts[2]), (long, long)]


def test_its_saved_modules_make_it_a_scorer_and_a_bare_causal_lm_stays_an_embedder(
    reranker_dir: Path,
) -> None:
    files = resolve(str(reranker_dir))
    task = task_of(files.config, files.directory)
    assert (task.kind, task.labels, task.activation) == ("score", ("LABEL_0",), "sigmoid")
    assert task.logit_score == LogitScore(*_yes_no(reranker_dir))
    bare = reranker_dir.parent / "causal-lm"  # the same weights, no sentence-transformers files
    assert task_of(resolve(str(bare)).config, bare).kind == "embed"


def _yes_no(directory: Path) -> tuple[int, int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    yes, no = tokenizer.token_to_id("yes"), tokenizer.token_to_id("no")
    assert yes is not None
    assert no is not None
    return yes, no


def test_pairs_are_rendered_and_cut_token_for_token_as_sentence_transformers_does(
    reranker_dir: Path, reference: Any, pairs: list[tuple[str, str]]
) -> None:
    tokenizer = ChatPairTokenizer(resolve(str(reranker_dir)), LENGTH)
    for instruction, prompt in ((None, None), (INSTRUCTION, INSTRUCTION)):
        features = reference[0].preprocess(pairs, prompt=prompt)
        mask = features["attention_mask"].bool()
        expected = [row[m].tolist() for row, m in zip(features["input_ids"], mask, strict=True)]
        encoded = tokenizer.encode_now(tokenizer.chat.render(pairs, instruction))
        assert [view.tolist() for view in encoded.views()] == expected
        assert encoded.truncated == 3  # the three long pairs, cut to the length
    assert max(map(len, expected)) == LENGTH
    with pytest.raises(InputTooLong):
        tokenizer.encode_now(tokenizer.chat.render(pairs, None), truncate=False)


@pytest.mark.parametrize("implementation", ["auto", "transformers"])
def test_scores_equal_cross_encoder_predict_and_rank(
    reranker_dir: Path,
    reference: Any,
    pairs: list[tuple[str, str]],
    implementation: str,
    tmp_path: Path,
) -> None:
    catalog = tmp_path / "models.toml"
    catalog.write_text(
        f'[models.qwen-reranker]\nsource = "{reranker_dir}"\nimplementation = "{implementation}"\n'
    )
    query, documents = pairs[0][0], [doc for _, doc in pairs[:19]] + [pairs[19][1]]
    with Reranker("qwen-reranker", devices="cpu", models_file=str(catalog)) as reranker:
        expected_code = "qwen3" if implementation == "auto" else "transformers"
        assert reranker._engine.replicas[0].model.implementation == expected_code
        scores = reranker.predict(pairs)
        raw = reranker.predict(pairs, raw=True)
        instructed = reranker.predict(pairs, instruction=INSTRUCTION)
        template_default = reranker.predict(pairs[:3], instruction="")
        ranked = reranker.rank(query, documents, top_k=5, instruction=INSTRUCTION)
        with pytest.raises(InvalidInput, match="single text"):
            reranker._call(reranker._engine.score(["a single text"]))
    np.testing.assert_allclose(scores, reference.predict(pairs), atol=1e-5, rtol=0)
    np.testing.assert_allclose(1 / (1 + np.exp(-raw)), scores, atol=1e-6, rtol=0)
    expected = reference.predict(pairs, prompt=INSTRUCTION)
    np.testing.assert_allclose(instructed, expected, atol=1e-5, rtol=0)
    assert np.abs(instructed - scores).max() > 1e-4  # the instruction reached the model
    np.testing.assert_allclose(template_default, scores[:3], atol=1e-6, rtol=0)
    theirs = reference.rank(query, documents, top_k=5, prompt=INSTRUCTION)
    assert [hit["corpus_id"] for hit in ranked] == [hit["corpus_id"] for hit in theirs]
    expected_hits = [hit["score"] for hit in theirs]
    assert [hit["score"] for hit in ranked] == pytest.approx(expected_hits, abs=1e-5)


def test_a_template_that_changes_the_contents_is_refused(
    reranker_dir: Path, tmp_path: Path
) -> None:
    import shutil

    changed = tmp_path / "trimmed"
    shutil.copytree(reranker_dir, changed)
    template = (changed / "chat_template.jinja").read_text()
    (changed / "chat_template.jinja").write_text(
        template.replace("| first }}", "| first | trim }}")
    )
    with pytest.raises(InvalidModel, match="verbatim"):
        ChatPairTokenizer(resolve(str(changed)), LENGTH)


@pytest.mark.anyio
async def test_the_rerank_routes_serve_it_and_an_embedding_request_is_sent_to_them(
    reranker_dir: Path, reference: Any, reference_texts: list[str], tmp_path: Path
) -> None:
    catalog = tmp_path / "models.toml"
    catalog.write_text(f'[models.qwen-reranker]\nsource = "{reranker_dir}"\n')
    query, documents = reference_texts[0], reference_texts[1:9]
    expected = reference.predict([(query, doc) for doc in documents], prompt=INSTRUCTION)
    plain = reference.predict([(query, doc) for doc in documents])
    settings = {"models_file": str(catalog), "preload": "qwen-reranker"}
    async with in_process(settings) as app:
        body = {"model": "qwen-reranker", "query": query, "documents": documents,
                "instruction": INSTRUCTION}  # fmt: skip
        cohere = await app.client.post("/v1/rerank", json=body)
        assert cohere.status_code == 200, cohere.text
        results = cohere.json()["results"]
        got = {hit["index"]: hit["relevance_score"] for hit in results}
        np.testing.assert_allclose([got[i] for i in range(8)], expected, atol=1e-5, rtol=0)
        tei = await app.client.post("/rerank", json={"query": query, "texts": documents})
        assert tei.status_code == 200, tei.text
        got = {hit["index"]: hit["score"] for hit in tei.json()}
        np.testing.assert_allclose([got[i] for i in range(8)], plain, atol=1e-5, rtol=0)
        embed = {"model": "qwen-reranker", "input": "x"}
        error = assert_envelope(await app.client.post("/v1/embeddings", json=embed), 400,
                                "wrong_model_task")  # fmt: skip
        assert "/v1/rerank" in error["message"]
        long = {"query": query, "texts": [" ".join(reference_texts)], "truncate": False}
        assert_envelope(await app.client.post("/rerank", json=long), 400,
                        "context_length_exceeded")  # fmt: skip
