"""The scoring routes: rerank (TEI's /rerank, Cohere's /v1/rerank and /v2/rerank, infinity's
/rerank) and classify (TEI's /predict, infinity's /classify and /v1/classify)."""

from __future__ import annotations

from blacksheep import Request, Response

from embedx.engine import ScoreOptions, ScoreResult
from embedx.errors import InvalidOption, WrongModelTask
from embedx.server.protocol import rerank
from embedx.server.protocol.rerank import ScoreRequest
from embedx.server.responses import json_response
from embedx.server.routes.embedding import json_body, timing
from embedx.server.state import ServerState


async def rerank_any(state: ServerState, http: Request) -> Response:
    """POST /rerank: TEI's shape, or Cohere's and infinity's (infinity's answer)."""
    request, style = rerank.parse_rerank(await json_body(http), state.settings.max_request_items)
    model, result, _ = await _score(state, request)
    if style == "tei":
        answer = rerank.tei_rerank_answer(request, result.scores)
        return json_response(answer, headers=timing(result))
    body = rerank.cohere_answer(request, result.scores, model, result.tokens, style, "1")
    return json_response(body, headers=timing(result))


async def rerank_cohere_v1(state: ServerState, http: Request) -> Response:
    return await _cohere(state, http, "1")


async def rerank_cohere_v2(state: ServerState, http: Request) -> Response:
    return await _cohere(state, http, "2")


async def _cohere(state: ServerState, http: Request, version: str) -> Response:
    request = rerank.parse_cohere(await json_body(http), state.settings.max_request_items)
    model, result, _ = await _score(state, request)
    body = rerank.cohere_answer(request, result.scores, model, result.tokens, "cohere", version)
    return json_response(body, headers=timing(result))


async def predict(state: ServerState, http: Request) -> Response:
    """TEI's /predict."""
    request = rerank.parse_predict(await json_body(http), state.settings.max_request_items)
    _, result, labels = await _score(state, request)
    return json_response(
        rerank.predict_answer(request, result.scores, labels), headers=timing(result)
    )


async def classify(state: ServerState, http: Request) -> Response:
    """infinity's /classify (and /v1/classify)."""
    request = rerank.parse_classify(await json_body(http), state.settings.max_request_items)
    model, result, labels = await _score(state, request)
    body = rerank.classify_answer(result.scores, labels, model, result.tokens)
    return json_response(body, headers=timing(result))


async def _score(
    state: ServerState, request: ScoreRequest
) -> tuple[str, ScoreResult, tuple[str, ...]]:
    """Lease the model (loading it on first use), wait for a slot, score: the model's name,
    the scores, and its labels."""
    model = request.model or _default_scorer(state)
    options = ScoreOptions(request.truncate, request.raw_scores, request.instruction)
    with state.tei.request("predict", len(request.inputs)) as record:
        admitted = state.admission.slot(len(request.inputs))
        async with state.registry.lease(model, request.load) as engine, admitted:
            try:
                result = await record.run(engine.score(request.inputs, options))
            except WrongModelTask as exc:
                raise WrongModelTask(
                    f"{exc.message}: send its texts to POST /v1/embeddings (or /embed)",
                    task=exc.task,
                ) from None
            return model, result, engine.task.labels


def _default_scorer(state: ServerState) -> str:
    """The model of a request naming none: EMBEDX_DEFAULT_MODEL where it scores (or is not
    loaded yet), else the first model of EMBEDX_PRELOAD that scores."""
    settings = state.settings
    tasks = {r.spec.name: r.engine.task.kind for r in state.registry.residents() if r.engine}
    default = settings.default_model
    if default is not None and tasks.get(default, "score") == "score":
        return default
    for name in settings.preload:
        if tasks.get(name) == "score":
            return name
    raise InvalidOption(
        "`model` is required: this server has no reranker or classifier to use for requests "
        "that name none (EMBEDX_DEFAULT_MODEL, or one in EMBEDX_PRELOAD)",
        param="model",
    )
