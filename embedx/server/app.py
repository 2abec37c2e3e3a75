"""The app factory: Settings in, the ASGI app out, its route table declared here and built
once: the guard outermost, the routes of each family within."""

from __future__ import annotations

from embedx.config import Settings
from embedx.registry import ModelRegistry, check_default_model, check_preload
from embedx.server.admission import Admission
from embedx.server.dispatch import Dispatch, Route
from embedx.server.guard import Guard
from embedx.server.routes import admin, openai, rerank, tei
from embedx.server.state import ServerState

ROUTES: tuple[Route, ...] = (
    ("POST", "/v1/embeddings", openai.create_embeddings),
    ("GET", "/v1/models", openai.list_models),
    ("GET", "/v1/models/{path:model}", openai.retrieve_model),
    # infinity's paths, as its clients' OpenAI base URL has no /v1
    ("POST", "/embeddings", openai.create_embeddings),
    ("GET", "/models", openai.list_models),
    ("GET", "/models/{path:model}", openai.retrieve_model),
    ("POST", "/embed", tei.embed_tei),
    ("POST", "/", tei.embed_tei),  # TEI's route too: clients given the bare URL post here
    ("POST", "/embed_sparse", tei.embed_sparse_tei),
    ("POST", "/tokenize", tei.tokenize_tei),
    ("POST", "/decode", tei.decode_tei),
    ("POST", "/rerank", rerank.rerank_any),  # TEI's shape, or Cohere's and infinity's
    ("POST", "/v1/rerank", rerank.rerank_cohere_v1),
    ("POST", "/v2/rerank", rerank.rerank_cohere_v2),
    ("POST", "/predict", rerank.predict),
    ("POST", "/classify", rerank.classify),
    ("POST", "/v1/classify", rerank.classify),
    ("GET", "/health", admin.health),
    ("GET", "/", admin.health),  # TEI's health check there too (with the key, if one is set)
    ("GET", "/info", admin.info),
    ("GET", "/metrics", admin.metrics),
    ("GET", "/openapi.json", admin.openapi_json),
    ("GET", "/docs", admin.docs),
    ("GET", "/docs/{asset}", admin.docs_asset),
)


def create_app(settings: Settings, registry: ModelRegistry | None = None) -> Guard:
    """The whole server as one ASGI app. Without a registry, devices are discovered and the
    catalog read here, before anything is served."""
    if registry is None:
        from embedx.devices import discover, open_accelerator
        from embedx.models.catalog import load_catalog

        registry = ModelRegistry(
            settings,
            load_catalog(settings.models_file),
            discover(settings),
            open_accelerator,
            local_paths=settings.allow_local_paths,
        )
    check_preload(settings, registry.catalog)
    check_default_model(settings, registry.catalog)
    admission = Admission(settings.max_inputs_in_flight, settings.request_queue_timeout_s)
    state = ServerState(settings, registry, registry.devices, admission)
    return Guard(Dispatch(ROUTES, state), state, (path for _, path, _ in ROUTES))
