"""The embedx app served by uvicorn instead of granian, for `load.py --http uvicorn`.

granian's embedded server (what `embedx serve` runs) reads and writes sockets in Rust
threads, each of which takes the interpreter lock to hand a request to Python and to take
its response back. uvicorn with httptools parses HTTP in the event loop's own thread, so no
other thread asks for the lock on a request's behalf. Comparing the two under the same load
measures what those hand-overs cost. Bench only: it needs `pip install uvicorn`. Settings
come from the environment, as for `embedx serve`.
"""

from __future__ import annotations

import uvicorn

from embedx.config import load_settings
from embedx.server.app import create_app


def main() -> None:
    settings = load_settings()
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level=settings.log_level,
        backlog=1024,
    )


if __name__ == "__main__":
    main()
