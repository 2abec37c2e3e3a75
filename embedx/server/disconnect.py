"""Running the app on a body already read while watching the connection: a client that hangs
up has its request cancelled, which drops its pending texts from its model's queue."""

from __future__ import annotations

import asyncio
import contextlib

from embedx.server.asgi import ASGIApp, Message, Receive, Scope, Send


class ClientGone(Exception):
    """The client disconnected before its request finished."""


async def watched(app: ASGIApp, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
    """Run `app` on `body`, raising ClientGone (its run cancelled) if the client leaves."""
    hung_up = asyncio.get_running_loop().create_future()
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await asyncio.shield(hung_up)

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                hung_up.set_result(message)
                return

    running = asyncio.ensure_future(app(scope, replay, send))
    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({running, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            raise ClientGone
        running.result()
    finally:
        watcher.cancel()
        running.cancel()
