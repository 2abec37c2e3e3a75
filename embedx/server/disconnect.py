"""Running the app on a body already read while watching the connection: a client that hangs
up has its request cancelled, which drops its pending texts from its model's queue."""

from __future__ import annotations

import asyncio

from embedx.server.asgi import ASGIApp, Message, Receive, Scope, Send

# A request is watched from this long after it starts: most small ones are answered before,
# and a watcher (a task awaiting the server's word of a hang-up) cost them more of the event
# loop's time than their texts did (1-text requests at 32 clients: about 15% of the loop).
# What a client that left without being seen still costs is at most this much work.
WATCH_AFTER_S = 0.05


class ClientGone(Exception):
    """The client disconnected before its request finished."""


async def watched(app: ASGIApp, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
    """Run `app` on `body`, raising ClientGone (its run cancelled) if the client leaves."""
    loop = asyncio.get_running_loop()
    hung_up = loop.create_future()
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
                running.cancel()
                return

    watcher: asyncio.Task[None] | None = None

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    running = asyncio.ensure_future(app(scope, replay, send))
    timer = loop.call_later(WATCH_AFTER_S, start_watching)
    try:
        await running  # cancelling this task (a stop) cancels the run too
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if hung_up.done() and current is not None and not current.cancelling():
            raise ClientGone from None
        raise
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
        running.cancel()
