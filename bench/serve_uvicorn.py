"""The embedx app served by uvicorn instead of granian, for `load.py --http uvicorn`.

granian's embedded server (what `embedx serve` runs) reads and writes sockets in Rust
threads, each of which takes the interpreter lock to hand a request to Python and to take
its response back. uvicorn with httptools parses HTTP in the event loop's own thread, so no
other thread asks for the lock on a request's behalf. Comparing the two under the same load
measures what those hand-overs cost. The loop is set up as `embedx serve` sets up its own
(uvloop, tasks started eagerly on Python 3.12 and later). Bench only: it needs
`pip install uvicorn httptools`. Settings come from the environment, as for `embedx serve`.
"""

from __future__ import annotations

import asyncio

import uvicorn
import uvloop

from embedx.config import load_settings
from embedx.server.app import create_app
from embedx.server.run import start_tasks_eagerly


async def serve() -> None:
    start_tasks_eagerly(asyncio.get_running_loop())  # as `embedx serve` does
    settings = load_settings()
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        http="httptools",
        lifespan="on",
        log_level=settings.log_level,
        access_log=False,
        backlog=1024,
    )
    await uvicorn.Server(config).serve()


if __name__ == "__main__":
    uvloop.run(serve())
