"""The app's lifespan: its startup loads the models of EMBEDX_PRELOAD (one that fails says
why, without a traceback), its shutdown drains the registry; entered directly, as
`embedx serve` does, and over ASGI's lifespan messages, as other servers do."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from embedx.config import load_settings
from embedx.server.app import create_app
from embedx.server.asgi import Message
from embedx.server.guard import Guard
from embedx.server.lifespan import StartupFailed
from tests.support.models import MINILM_NAME

pytestmark = pytest.mark.anyio


def failing_preload(tmp_path: Path) -> dict[str, object]:
    models = tmp_path / "models.toml"
    models.write_text(f'[models.a]\nsource = "{tmp_path / "gone"}"\npooling = "cls"\n')
    return {"preload": "a", "models_file": models}


async def test_the_lifespan_preloads_on_entry_and_drains_on_exit() -> None:
    app = create_app(load_settings({"preload": MINILM_NAME}, environ={}))
    async with app.lifespan():
        (resident,) = app.state.registry.residents()
        assert resident.engine is not None
        assert resident.engine.serving
    assert app.state.registry.residents() == []


async def test_a_model_that_fails_to_preload_fails_the_startup_with_its_error(
    tmp_path: Path,
) -> None:
    app = create_app(load_settings(failing_preload(tmp_path), environ={}))
    with pytest.raises(StartupFailed, match="did not load: model 'a' is not a directory"):
        async with app.lifespan():
            raise AssertionError("entered a lifespan whose startup failed")


async def lifespan_messages(app: Guard, then_stop: bool) -> list[Message]:
    """What the app answers to ASGI's lifespan messages: a startup, then a shutdown."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    sent: list[Message] = []
    replied = asyncio.Event()

    async def send(message: Message) -> None:
        sent.append(message)
        replied.set()

    await inbox.put({"type": "lifespan.startup"})
    running = asyncio.create_task(app({"type": "lifespan"}, inbox.get, send))
    await replied.wait()
    if then_stop and sent[0]["type"] == "lifespan.startup.complete":
        await inbox.put({"type": "lifespan.shutdown"})
    await running
    return sent


async def test_other_servers_start_and_stop_it_over_asgi(tmp_path: Path) -> None:
    app = create_app(load_settings({}, environ={}))
    sent = await lifespan_messages(app, then_stop=True)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    failing = create_app(load_settings(failing_preload(tmp_path), environ={}))
    (failed,) = await lifespan_messages(failing, then_stop=False)
    assert failed["type"] == "lifespan.startup.failed"
    assert failed["message"].startswith("a model of EMBEDX_PRELOAD did not load")
