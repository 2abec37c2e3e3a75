"""What every embedding route does between parsing and answering: read the JSON body, lease
the model, wait for a slot, embed; and TEI's timing headers for the answer."""

from __future__ import annotations

from blacksheep import Request

from embedx.engine import EmbedOptions, EmbedResult, ScoreResult
from embedx.engine.outputs import RowSink
from embedx.errors import WrongModelTask
from embedx.server.protocol.family import EmbedRequest, check_json_body
from embedx.server.state import ServerState

# Where a model's rows come from, by what it gives (a WrongModelTask's task)
ROUTES = {
    "score": "send its (query, document) pairs to POST /rerank, /v1/rerank or /v2/rerank (a "
             "classifier's texts to /predict or /classify)",
    "sparse": 'its sparse rows come from POST /embed_sparse, or POST /v1/embeddings with '
              'encoding_format "sparse"',
    "embed": "its dense rows come from POST /embed or POST /v1/embeddings (BGE-M3's sparse and "
             'ColBERT rows too, with embedding_types "sparse" and "colbert")',
}  # fmt: skip


async def json_body(http: Request) -> bytes:
    check_json_body(
        http.get_first_header(b"content-type"), http.get_first_header(b"content-encoding")
    )
    return await http.read() or b""


async def embed(
    state: ServerState, request: EmbedRequest, sink: RowSink | None = None
) -> EmbedResult:
    """Lease the model (loading it on first use), wait for a slot, embed. In that order: a
    request waiting for its model's load holds no slot that another model's requests need."""
    options = EmbedOptions(
        dimensions=request.dimensions,
        normalize=request.normalize,
        truncate=request.truncate,
        input_type=request.input_type,
        encodings=request.encodings,
        sink=sink,
        instruction=request.instruction,
        outputs=request.outputs,
        top_k=request.top_k,
    )
    with state.tei.request("embed", len(request.texts)) as record:
        async with (
            state.registry.lease(request.model, request.load) as engine,
            state.admission.slot(len(request.texts)),
        ):
            try:
                return await record.run(engine.embed(request.texts, options))
            except WrongModelTask as exc:
                raise WrongModelTask(f"{exc.message}: {ROUTES[exc.task]}", task=exc.task) from None


def timing(result: EmbedResult | ScoreResult) -> dict[str, str]:
    """TEI's timing headers, in whole milliseconds as TEI sends them: where a request's time
    went."""
    return {
        "x-tokenization-time": str(int(result.tokenize_s * 1000)),
        "x-inference-time": str(int((result.total_s - result.tokenize_s) * 1000)),
        "x-total-time": str(int(result.total_s * 1000)),
        "x-total-tokens": str(result.tokens),
    }
