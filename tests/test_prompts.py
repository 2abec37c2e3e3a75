"""Prompts: the input types a request names and the prompt each takes, and instructions in
a query prompt's slot, through the server (OpenAI's, infinity's and TEI's routes) and the
library, bit for bit against the same texts wrapped by hand."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedx import Embedder
from embedx.engine.texts import Prompts
from embedx.errors import InvalidInput, InvalidOption
from embedx.models.catalog import ModelSpec
from embedx.models.prompts import FAMILIES, INPUT_TYPES, MAX_INSTRUCTION
from embedx.models.source import HUB_PREFIX, ModelFiles
from tests.support.server import InProcess, assert_envelope, in_process

DEFAULT = "Given a web search query, retrieve relevant passages that answer the query"
QUERY = "Instruct: {instruction}\\nQuery: {text}"  # as TOML writes the newline


def by_hand(instruction: str, text: str) -> str:
    return f"Instruct: {instruction}\nQuery: {text}"


@pytest.fixture(scope="module")
def models_file(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """MiniLM twice: with an instruct model's prompts, and bare (the texts wrapped by hand)."""
    models = tmp_path_factory.mktemp("prompts") / "models.toml"
    models.write_text(
        f'[models.instructed]\nsource = "{minilm_dir}"\npooling = "mean"\n'
        + 'prompts = { query = "'
        + QUERY
        + '", passage = "{text}" }\n'
        + f'default_instruction = "{DEFAULT}"\n'
        + f'[models.plain]\nsource = "{minilm_dir}"\npooling = "mean"\n'
    )
    return models


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide: the app below serves every server test of the module


@pytest.fixture(scope="module")
async def served(models_file: Path) -> AsyncIterator[InProcess]:
    async with in_process({"models_file": models_file}) as app:
        yield app


async def rows(app: InProcess, path: str, body: dict[str, Any]) -> list[bytes]:
    """Each text's vector, as the bytes of its float32s."""
    if path == "/embed":
        response = await app.client.post(path, json=body)
        assert response.status_code == 200, response.text
        return [np.array(row, np.float32).tobytes() for row in response.json()]
    response = await app.client.post(path, json={**body, "encoding_format": "base64"})
    assert response.status_code == 200, response.text
    return [base64.b64decode(item["embedding"]) for item in response.json()["data"]]


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "texts"), [("/v1/embeddings", "input"),
                                             ("/embeddings", "input"),  # infinity's
                                             ("/embed", "inputs")])  # fmt: skip
async def test_an_instruction_fills_the_query_slot_as_the_text_wrapped_by_hand(
    served: InProcess, path: str, texts: str
) -> None:
    """Bit for bit: the instruction, or the model's default one, in the query prompt; with
    no input type, an instruction makes the texts queries."""
    asked = ["The quick brown fox", "A lazy dog"]
    task = "Classify the sentiment of a product review"

    async def vectors(model: str, sent: list[str], **fields: Any) -> list[bytes]:
        return await rows(served, path, {"model": model, texts: sent, **fields})

    wrapped = await vectors("plain", [by_hand(task, text) for text in asked])
    assert await vectors("instructed", asked, instruction=task) == wrapped
    prompt = "prompt_name" if path == "/embed" else "input_type"
    asked_as_query = await vectors("instructed", asked, instruction=task, **{prompt: "query"})
    assert asked_as_query == wrapped
    defaulted = await vectors("plain", [by_hand(DEFAULT, text) for text in asked])
    assert await vectors("instructed", asked, **{prompt: "query"}) == defaulted
    assert await vectors("instructed", asked, **{prompt: "search_query"}) == defaulted
    assert await vectors("instructed", asked, **{prompt: "document"}) == await vectors(
        "plain", asked
    )


@pytest.mark.anyio
async def test_an_instruction_for_a_model_without_a_slot_is_a_400_naming_the_model(
    served: InProcess,
) -> None:
    for path, texts in (("/v1/embeddings", "input"), ("/embed", "inputs")):
        body = {"model": "plain", texts: "x", "instruction": "Retrieve passages"}
        error = assert_envelope(await served.client.post(path, json=body), 400, "invalid_option")
        assert error["param"] == "instruction"
        assert "model 'plain' takes no instruction" in error["message"]
    body = {"model": "instructed", "input": "x", "instruction": "Retrieve passages",
            "input_type": "passage"}  # fmt: skip
    response = await served.client.post("/v1/embeddings", json=body)
    error = assert_envelope(response, 400, "invalid_option")
    assert "has no {instruction} slot" in error["message"]
    over = {"model": "instructed", "input": "x", "instruction": "i" * (MAX_INSTRUCTION + 1)}
    response = await served.client.post("/v1/embeddings", json=over)
    assert assert_envelope(response, 400, "invalid_option")["param"] == "instruction"


@pytest.mark.anyio
async def test_an_unknown_input_type_is_a_400_naming_those_the_model_takes(
    served: InProcess,
) -> None:
    body = {"model": "instructed", "input": "x", "input_type": "questions"}
    response = await served.client.post("/v1/embeddings", json=body)
    error = assert_envelope(response, 400, "invalid_option")
    assert error["param"] == "input_type"
    assert ", ".join(INPUT_TYPES) in error["message"]
    assert "its prompts: passage, query" in error["message"]
    tei = {"model": "instructed", "inputs": "x", "prompt_name": "questions"}
    error = assert_envelope(await served.client.post("/embed", json=tei), 400, "invalid_option")
    assert error["param"] == "prompt_name"  # TEI's field for it


@pytest.mark.anyio
async def test_tei_ignores_input_type_as_it_ignores_every_field_it_does_not_read(
    served: InProcess,
) -> None:
    bare = await rows(
        served, "/embed", {"model": "instructed", "inputs": "x", "prompt_name": "passage"}
    )
    for ignored in ("search_query", "questions", 5, ["query"]):
        body = {"model": "instructed", "inputs": "x", "input_type": ignored}
        assert await rows(served, "/embed", body) == bare  # the default: passage, bare


def test_the_library_fills_the_slot_as_the_server_does(models_file: Path) -> None:
    asked = ["The quick brown fox", "A lazy dog"]
    task = "Find the sentence that says the same"
    with Embedder("plain", models_file=str(models_file)) as plain:
        wrapped = plain.embed([by_hand(task, text) for text in asked])
        defaulted = plain.embed([by_hand(DEFAULT, text) for text in asked])
    with Embedder("instructed", models_file=str(models_file)) as instructed:
        assert np.array_equal(instructed.embed(asked, instruction=task), wrapped)
        assert np.array_equal(instructed.embed(asked, input_type="clustering"), defaulted)

        async def awaited() -> np.ndarray:
            return await instructed.aembed(asked, instruction=task, input_type="search_query")

        assert np.array_equal(asyncio.run(awaited()), wrapped)
        with pytest.raises(InvalidOption, match="has no \\{instruction\\} slot"):
            instructed.embed(asked, instruction=task, input_type="search_document")
        with pytest.raises(InvalidOption, match="instruction is not valid Unicode"):
            instructed.embed(asked, instruction="Find \udcff")


def prompts(st_prompts: dict[str, str], source: str = "somewhere", **spec: Any) -> Prompts:
    files = ModelFiles(directory=Path("."), weights=(), config={}, st_prompts=st_prompts)
    return Prompts.of(ModelSpec(name="m", source=source, **spec), files, None)


def wrapped(model: Prompts, input_type: str | None, instruction: str | None = None) -> str:
    return model.wrap(["T"], input_type, instruction)[0]


def test_every_input_type_takes_the_prompt_the_table_gives_it() -> None:
    e5 = prompts({}, prompts={"query": "query: {text}", "passage": "passage: {text}"})
    taken = {input_type: wrapped(e5, input_type) for input_type in INPUT_TYPES}
    assert taken == {"query": "query: T", "passage": "passage: T", "document": "passage: T",
                     "search_query": "query: T", "search_document": "passage: T",
                     "classification": "query: T", "clustering": "query: T"}  # fmt: skip
    # a sentence-transformers config's own names come first, and any other is taken as is
    nomic = prompts({"search_query": "search_query: ", "search_document": "search_document: ",
                     "classification": "classification: ", "ocr": "ocr {text}: "})  # fmt: skip
    assert wrapped(nomic, "classification") == "classification: T"
    assert wrapped(nomic, "document") == "search_document: T"
    assert wrapped(nomic, "query") == "search_query: T"
    assert wrapped(nomic, "ocr") == "ocr {text}: T"
    with pytest.raises(InvalidInput, match="no prompt for input_type 'clustering'"):
        wrapped(nomic, "clustering")
    with pytest.raises(InvalidOption, match="its prompts: classification, ocr, search_"):
        wrapped(nomic, "Query")


def test_the_instruct_families_take_their_published_templates() -> None:
    qwen3 = {"query": "Instruct: Given a web search query, retrieve relevant passages that "
                      "answer the query\nQuery:", "document": ""}  # fmt: skip
    model = prompts(qwen3, source=HUB_PREFIX + "Qwen/Qwen3-Embedding-0.6B")
    assert wrapped(model, "query", "Find code") == "Instruct: Find code\nQuery:T"
    assert wrapped(model, None, "Find code") == "Instruct: Find code\nQuery:T"
    assert wrapped(model, "query") == qwen3["query"] + "T"  # its config's, exactly
    assert wrapped(model, "passage") == "T"
    icl = prompts({}, source="BAAI/bge-en-icl")  # a catalog entry's source, as written
    assert wrapped(icl, "query", "Find code") == "<instruct>Find code\n<query>T\n<response>"
    own = prompts({}, source="Qwen/Qwen3-Embedding-8B", prompts={"query": "q: {text}"})
    with pytest.raises(InvalidOption, match="takes no instruction"):
        wrapped(own, "query", "Find code")  # a catalog entry's prompts replace the family's
    for family in FAMILIES.values():
        assert family.prompts["query"].count("{instruction}") == 1


@pytest.mark.parametrize(
    ("prompts_", "default", "message"),
    [
        ({"query": "Instruct: {instruction}\nQuery: {text}"}, None, "needs a default_instruction"),
        ({"query": "query: {text}"}, "Retrieve", "no prompt has an {instruction} slot"),
        ({"query": "{text} {instruction}"}, "Retrieve", "once, before {text}"),
        ({"query": "{instruction}{instruction}{text}"}, "Retrieve", "once, before {text}"),
        ({"query": "{instruction}: {text}"}, "i" * (MAX_INSTRUCTION + 1), "over 4096"),
    ],
)
def test_a_catalog_slot_is_checked_with_its_default_instruction(
    prompts_: dict[str, str], default: str | None, message: str
) -> None:
    with pytest.raises(InvalidOption, match=message.replace("{", "\\{").replace("}", "\\}")):
        ModelSpec(name="m", source="m", prompts=prompts_, default_instruction=default)


def test_every_input_type_is_in_the_docs_table_as_the_code_has_it() -> None:
    table = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
    for input_type, names in INPUT_TYPES.items():
        row = f"| `{input_type}` | " + ", ".join(f"`{name}`" for name in names) + " |"
        assert row in table, row
