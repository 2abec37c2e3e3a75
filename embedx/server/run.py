"""`embedx serve`: the app on uvloop, served in-process by granian's embedded server over RSGI
(server/rsgi.py); on SIGTERM or Ctrl-C it stops taking requests, drains the ones in flight,
unloads, exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import resource
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING

from embedx import heap, os_threads
from embedx.config import Settings
from embedx.server import logs
from embedx.server.app import create_app
from embedx.server.lifespan import StartupFailed
from embedx.server.rsgi import RsgiBridge
from embedx.server.state import ServerState

if TYPE_CHECKING:
    from granian.server.embed import Server

log = logging.getLogger("embedx.server")
IO_THREADS = "embedx-io"
STRAGGLERS_S = 1.0  # after the drain, for requests failed by the unload to send their 503
# After the stop, for the HTTP server to close its connections: one whose client neither
# reads its response nor finishes its request would hold the exit as long as it likes.
CLOSING_S = 2.0
# Connections held at once at most: each costs a few kB until it sends a request, and the body
# budget bounds what their bodies hold. SPARE_FILES are kept for the model's files, logs, pipes.
MAX_CONNECTIONS = 65536
SPARE_FILES = 256


class _ConnectionsLeft(Exception):
    """Connections were still open CLOSING_S after the stop: the process exits without them."""


def serve(settings: Settings) -> int:
    import uvloop

    logs.configure(settings.log_level)
    heap.manage()  # the process is the server's: loading a model may tune its collector
    if not _loopback(settings.host) and not settings.api_key:
        log.warning(
            "binding %s with no API key: anyone who can reach this port can use the server "
            "(set EMBEDX_API_KEY)",
            settings.host,
        )
    # The loop's own thread pool (asyncio.to_thread: resolving and building a model), so
    # that a stop asked for while a load runs there need not wait for it.
    executor = os_threads.executor(None, IO_THREADS)
    loop = uvloop.new_event_loop()
    loop.set_default_executor(executor)
    try:
        code = loop.run_until_complete(_serve(settings))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except _ConnectionsLeft:  # the HTTP server's threads still hold them: not waited for
        logging.shutdown()
        os._exit(0)
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        loop.close()
    workers = [t for t in threading.enumerate() if t.name.startswith(IO_THREADS)]
    for worker in workers:
        worker.join(timeout=1.0)  # an idle one ends at once
    if any(worker.is_alive() for worker in workers):
        # A model load (a download, weights being read) still runs and cannot be stopped;
        # waiting for it would hold the exit for as long as it takes.
        log.warning("stopped; not waiting for a model load still running")
        logging.shutdown()
        os._exit(code)
    return code


def _loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback  # EMBEDX_HOST is checked to be an address


def start_tasks_eagerly(loop: asyncio.AbstractEventLoop) -> None:
    """On Python 3.12 and later, a new task runs its first step at once.

    Otherwise that step waits for the loop's next turn, 15 to 30 ms under load, and a request
    starts several tasks (granian's, the bridge's, the guard's). Eagerly, parsing and admission
    took 0.4 ms a request, mean, against 8.1 and 9.3 (bench/load.py, on an H200)."""
    if sys.version_info >= (3, 12):
        loop.set_task_factory(asyncio.eager_task_factory)


def _connection_cap() -> int:
    """The connections granian may hold at once (its `backpressure`; a connection holds its
    place until it closes, idle or sending its body). Its default, the backlog, let 1,024
    clients sending their bodies slowly lock every other one out. As many as the process may
    open files for, less SPARE_FILES: past that, accepting fails at once and granian would
    try again and again. The soft limit on open files is raised to the hard one first (for
    MAX_CONNECTIONS at most), as Go's runtime does for every program it starts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_CONNECTIONS + SPARE_FILES
    if soft < wanted and (hard == resource.RLIM_INFINITY or soft < hard):
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):  # a container may forbid it
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    return max(soft // 2, min(MAX_CONNECTIONS, soft - SPARE_FILES))


def _port_taken(host: str, port: int) -> OSError | None:
    """Why `host:port` cannot be listened on, if it cannot. granian binds with SO_REUSEPORT:
    a second embedx on a taken port would start and take half of the first one's requests."""
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


async def _serve(settings: Settings) -> int:
    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server

    taken = _port_taken(settings.host, settings.port)
    if taken is not None:  # said before any model loads, not after
        log.error(
            "cannot listen on %s:%d (%s): another embedx, or another program, has it; "
            "set EMBEDX_PORT or --port",
            settings.host,
            settings.port,
            taken.strerror or taken,
        )
        return 1
    app = create_app(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    start_tasks_eagerly(loop)
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with contextlib.AsyncExitStack() as running:
        # models to preload load here, before the port opens; a signal meanwhile stops it
        starting = asyncio.ensure_future(running.enter_async_context(app.lifespan()))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not starting.done():
            log.info("stopping before the port opened: the models being preloaded are dropped")
            await app.state.registry.drain(0)  # cancels the loads: the startup ends with them
            with contextlib.suppress(StartupFailed):
                await starting
            return 0
        try:
            starting.result()
        except StartupFailed as exc:
            log.error("the server did not start: %s", exc)
            return 1
        server = Server(
            RsgiBridge(app),
            address=settings.host,
            port=settings.port,
            interface=Interfaces.RSGI,
            # HTTP/1.1 only: over HTTP/2 a body needs no declared length, and the bridge reads
            # one that is not chunked in a single call, before the size limit could stop it
            http=HTTPModes.http1,
            websockets=False,
            log_level=settings.log_level,  # type: ignore[arg-type]
            backlog=1024,
            backpressure=_connection_cap(),
        )
        return await _until_stopped(server, stop, settings, app.state)


async def _until_stopped(
    server: Server, stop: asyncio.Event, settings: Settings, state: ServerState
) -> int:
    """Serve until SIGTERM or Ctrl-C, then stop taking requests and drain those in flight."""
    serving = asyncio.create_task(server.serve())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():  # it never started (the port is taken, say)
        stopping.cancel()
        error = serving.exception()
        log.error("the server stopped: %s", error or "no reason given")
        return 1
    log.info(
        "shutting down: draining requests in flight (up to %.0f s; a second signal ends them now)",
        settings.drain_timeout_s,
    )
    state.stop_taking()  # bodies still arriving end now: only work in flight is drained
    stop.clear()
    idle = asyncio.create_task(state.idle.wait())
    again = asyncio.create_task(stop.wait())
    await asyncio.wait({idle, again}, timeout=settings.drain_timeout_s,
                       return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    idle.cancel()
    again.cancel()
    if state.in_flight:
        # The server stops waiting for them: unloading fails their pending texts, so they
        # end now with a 503 the client can retry elsewhere, not when the work is done
        # (granian's stop waits for every request; a supervisor's grace period would not).
        log.warning(
            "%d requests still running after %s: failing them (503)",
            state.in_flight,
            "a second signal" if again.done() and not again.cancelled() else "the drain timeout",
        )
        await state.registry.drain(0)
        # What the engine did not hold (a body still arriving, say) would keep the stop
        # waiting for its client: after a moment for the others' 503s, it ends with one too.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STRAGGLERS_S):
                await state.idle.wait()
        for request in list(state.requests):
            request.cancel()
    server.stop()  # type: ignore[no-untyped-call]  # stop accepting; `lifespan` unloads
    try:
        async with asyncio.timeout(CLOSING_S):
            await asyncio.shield(serving)
    except TimeoutError:
        log.warning(
            "connections still open %.0f s after the stop (clients that neither read their "
            "response nor finish their request): exiting without them",
            CLOSING_S,
        )
        raise _ConnectionsLeft from None
    log.info("stopped")
    return 0
