"""The server's lifespan: at startup the models of EMBEDX_PRELOAD load, at shutdown the
registry drains; one async context manager, which `embedx serve` enters itself and other ASGI
servers reach through ASGI's lifespan messages."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

from embedx.errors import EmbedxError, ShuttingDown
from embedx.server.asgi import Receive, Send
from embedx.server.state import ServerState


class StartupFailed(Exception):
    """A model of EMBEDX_PRELOAD did not load: the server cannot serve what it was started
    for. Its message says which error, without a traceback."""


@contextlib.asynccontextmanager
async def lifespan(state: ServerState) -> AsyncIterator[None]:
    settings = state.settings
    try:
        await state.registry.preload(settings.preload)
    except ShuttingDown:  # stopped while loading (`embedx serve`): nothing left to serve
        pass
    except EmbedxError as error:
        raise StartupFailed(f"a model of EMBEDX_PRELOAD did not load: {error.message}") from None
    try:
        yield
    finally:
        await state.registry.drain(settings.drain_timeout_s)


async def speak(
    running: Callable[[], AbstractAsyncContextManager[None]], receive: Receive, send: Send
) -> None:
    """ASGI's lifespan messages over `running`: entered at startup, exited at shutdown."""
    await receive()  # lifespan.startup
    async with contextlib.AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(running())
        except StartupFailed as failed:
            await send({"type": "lifespan.startup.failed", "message": str(failed)})
            return
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
    await send({"type": "lifespan.shutdown.complete"})
