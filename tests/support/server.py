"""The server, as the tests call it: in this process over httpx's ASGI transport (the app with
its lifespan, no socket), or as `embedx serve` in a process of its own on a free port, for
what only a real one has (signals, sockets, granian); and what both kinds of test check."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
from prometheus_client.parser import text_string_to_metric_families

from embedx.registry import ModelRegistry, local_name
from embedx.server.app import create_app
from embedx.server.guard import Guard
from embedx.server.state import ServerState
from tests.support.processes import environment
from tests.support.settings import settings_of
from tests.support.waiting import PATIENCE_S, eventually

BASE_URL = "http://embedx"

# -- in this process -------------------------------------------------------------------------


@dataclass
class InProcess:
    """The real app, started (its models preloaded), and a client that calls it."""

    app: Guard
    client: httpx.AsyncClient

    @property
    def state(self) -> ServerState:
        return self.app.state


@contextlib.asynccontextmanager
async def in_process(
    settings: Mapping[str, object] | None = None, *, registry: ModelRegistry | None = None
) -> AsyncIterator[InProcess]:
    """The app with these settings (over patient time limits, none from the environment)
    on the host's own devices, or the app over `registry` (with its settings), its lifespan
    entered."""
    if registry is not None:
        assert settings is None, "the registry's settings are the app's"
        app = create_app(registry.settings, registry)
    else:
        app = create_app(settings_of(settings))
    async with app.lifespan(), asgi_client(app) as client:
        yield InProcess(app, client)


@contextlib.asynccontextmanager
async def asgi_client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
        yield client


def sdk(app: Guard, key: str = "unused") -> openai.AsyncOpenAI:
    """The OpenAI SDK, its requests to the app in this process (over the ASGI transport of
    httpx2, the SDK's own HTTP client)."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))
    return openai.AsyncOpenAI(
        base_url=BASE_URL + "/v1", api_key=key, max_retries=0, http_client=http
    )


# -- in a process of its own ---------------------------------------------------------------------


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def wait_for_output(self, text: str) -> None:
        """Until the server's log holds `text` (a line is written as its request finishes)."""
        eventually(lambda: text in self.output(), message=f"{text!r} never logged")


# Loaded by the server's interpreter (sitecustomize): a batch waits in the device's thread
# while the file exists, after the start's own smoke test has run.
_HOLD_SOURCE = """
import time
from pathlib import Path
import embedx.engine.replica as replica
held = Path({path!r})
run = replica.Replica.run
def held_run(self, *args, **kwargs):
    while held.exists():
        time.sleep(0.01)  # a poll of the test's hold, not a wait for time
    return run(self, *args, **kwargs)
replica.Replica.run = held_run
"""


class BatchHold:
    """A server process's batches held in its device thread while the test holds them: a
    device busy exactly as long as the test needs (the Gate of support/fakes.py, across a
    process), where a request long enough to outlast the test's steps would be a race."""

    def __init__(self, tmp: Path) -> None:
        self.site = tmp / "held-site"
        self.site.mkdir()
        self.file = tmp / "batches-held"
        (self.site / "sitecustomize.py").write_text(_HOLD_SOURCE.format(path=str(self.file)))

    def hold(self) -> None:
        self.file.touch()

    def release(self) -> None:
        self.file.unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve_environment(**settings: object) -> dict[str, str]:
    """This process's environment without its EMBEDX_ settings, with these instead over
    patient time limits, on a free port."""
    return environment({"port": free_port(), **settings})


@contextlib.contextmanager
def running_server(
    tmp: Path, *, held: BatchHold | None = None, **settings: object
) -> Iterator[Server]:
    """`embedx serve` with these settings, once its /health answers; SIGTERM after. With
    `held`, its batches wait while the test holds them."""
    # The free port found may be taken before the server binds it (a client's socket, in a
    # test beside this one): the server says so before loading anything, and another is tried.
    for _ in range(3):
        server = _start(tmp, held, settings)
        if server.process.poll() is None:
            break
    else:
        raise AssertionError("the server did not start:\n" + server.output())
    try:
        yield server
    finally:
        process = server.process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(PATIENCE_S)
            except subprocess.TimeoutExpired:  # a stop that hangs fails; it holds no port
                process.kill()
                process.wait()
                raise


def _start(tmp: Path, held: BatchHold | None, settings: dict[str, object]) -> Server:
    """`embedx serve` once its /health answers, or once it has ended on a taken port."""
    env = serve_environment(**settings)
    if held is not None:
        env["PYTHONPATH"] = str(held.site)
    log = tmp / f"server-{env['EMBEDX_PORT']}.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "embedx", "serve"], env=env,
                                   stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    server = Server(f"http://127.0.0.1:{env['EMBEDX_PORT']}", process, log)

    def up_or_ended() -> bool:
        try:
            return httpx.get(server.url + "/health", timeout=PATIENCE_S).status_code == 200
        except httpx.TransportError:
            return process.poll() is not None

    try:
        eventually(up_or_ended)
        assert process.poll() is None or "cannot listen on" in server.output()
    except AssertionError:
        process.kill()
        raise AssertionError("the server did not start:\n" + server.output()) from None
    return server


def client(server: Server, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def post(server: Server, path: str, timeout: float = 120, **kwargs: Any) -> httpx.Response:
    return httpx.post(server.url + path, timeout=timeout, **kwargs)


def info(server: Server) -> dict[str, Any]:
    return dict(httpx.get(server.url + "/info", timeout=PATIENCE_S).json())


def until_embedding(server: Server) -> None:
    """Wait until a request holds a slot: admitted, its texts embedding."""
    eventually(lambda: info(server)["requests"]["running"] >= 1,
               message="no request started embedding")  # fmt: skip


def until_receiving(server: Server, bodies: int) -> None:
    """Wait until `bodies` requests are in the app, their bodies arriving."""
    eventually(lambda: info(server)["requests"]["http_receiving"] >= bodies,
               message=f"{bodies} requests did not reach the app")  # fmt: skip


# -- what both check ---------------------------------------------------------------------------


def served_as(directory: Path | str) -> str:
    """The name a model in a local directory is served and listed under."""
    return local_name(Path(directory).resolve())


def resolved(directory: Path) -> str:
    """The directory's real path (a sync call, for async tests)."""
    return str(directory.resolve())


def assert_envelope(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is an error of `status` and `code` in the OpenAI envelope, and says
    nothing of the server's insides."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert "Traceback" not in error["message"]
    return dict(error)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name` with exactly these labels in Prometheus text, if any."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def samples(text: str, name: str) -> list[dict[str, str]]:
    """The label sets of every sample `name` in Prometheus text."""
    return [sample.labels for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name]  # fmt: skip
