"""`embedx serve`'s life as a process: a start that fails says why and exits, and SIGTERM or
Ctrl-C stops taking requests, drains those in flight (a second signal, or the drain timeout,
fails what still runs) and exits 0, whatever clients that never finish are doing."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.support.models import MINILM_NAME
from tests.support.server import (
    BatchHold,
    Server,
    assert_envelope,
    post,
    running_server,
    serve_environment,
    until_embedding,
    until_receiving,
)
from tests.support.waiting import PATIENCE_S, eventually

pytestmark = pytest.mark.process  # each test starts a process of its own


def test_a_model_that_fails_to_preload_stops_the_server(tmp_path: Path) -> None:
    def serve(**settings: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "embedx", "serve"],
                              env=serve_environment(**settings), capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    # a name the catalog lacks is a configuration error, as `embedx check` says
    done = serve(preload="no-such/model")
    assert done.returncode == 2
    assert "EMBEDX_PRELOAD names models not in the catalog: ['no-such/model']" in done.stderr
    assert "Traceback" not in done.stderr
    # a catalog model whose load fails stops the start
    models = tmp_path / "models.toml"
    models.write_text(f'[models.a]\nsource = "{tmp_path / "gone"}"\npooling = "cls"\n')
    done = serve(preload="a", models_file=models)
    assert done.returncode == 1
    assert "the server did not start: a model of EMBEDX_PRELOAD did not load" in done.stderr
    assert "is not a directory" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_binding_beyond_loopback_without_a_key_warns(tmp_path: Path) -> None:
    with running_server(tmp_path, host="0.0.0.0") as exposed:
        pass
    assert "no API key" in exposed.output()


def in_flight(server: Server, texts: list[str], results: list[httpx.Response]) -> threading.Thread:
    """A request for `texts` sent on a thread, its answer appended to `results`, once it is
    embedding."""
    body = {"model": MINILM_NAME, "input": texts}
    worker = threading.Thread(
        target=lambda: results.append(post(server, "/v1/embeddings", json=body, timeout=600))
    )
    worker.start()
    until_embedding(server)
    return worker


def until_draining(server: Server) -> None:
    """Until /health says 503: `stop_taking` has run."""
    eventually(lambda: httpx.get(server.url + "/health", timeout=PATIENCE_S).status_code == 503,
               message="the server is not draining")  # fmt: skip


def test_sigterm_drains_the_request_in_flight_and_exits_0(
    tmp_path: Path, reference_texts: list[str]
) -> None:
    # Its batches held until the late request is refused: the test is that the stop waits
    # for the request, not how long the request takes.
    held = BatchHold(tmp_path)
    with running_server(tmp_path, held=held, preload=MINILM_NAME, drain_timeout_s=600) as stopping:
        results: list[httpx.Response] = []
        held.hold()
        worker = in_flight(stopping, reference_texts[:60], results)
        stopping.process.send_signal(signal.SIGTERM)
        until_draining(stopping)
        late = post(stopping, "/v1/embeddings", json={"model": MINILM_NAME, "input": "x"})
        assert_envelope(late, 503, "shutting_down")  # refused, while the one in flight runs
        held.release()
        worker.join()
        assert stopping.process.wait(600) == 0
        assert results[0].status_code == 200
        assert len(results[0].json()["data"]) == 60
        assert "draining" in stopping.output()


def test_a_second_signal_ends_the_drain_at_once(tmp_path: Path, reference_texts: list[str]) -> None:
    """As with uvicorn: the first Ctrl-C drains, the second stops waiting."""
    held = BatchHold(tmp_path)
    with running_server(tmp_path, held=held, preload=MINILM_NAME, drain_timeout_s=600) as stopping:
        results: list[httpx.Response] = []
        held.hold()  # until the second signal has failed the request
        worker = in_flight(stopping, reference_texts[:60], results)
        stopping.process.send_signal(signal.SIGINT)
        until_draining(stopping)
        stopping.process.send_signal(signal.SIGINT)
        stopping.wait_for_output("after a second signal: failing them")
        held.release()  # the batch its device runs ends; the exit waits for no other
        assert stopping.process.wait(PATIENCE_S) == 0  # not the 600 s drain
        worker.join()
        error = assert_envelope(results[0], 503, "shutting_down")
        assert "the server shut down before this request finished" in error["message"]


def test_sigterm_past_the_drain_timeout_fails_what_still_runs_and_exits(
    tmp_path: Path, reference_texts: list[str]
) -> None:
    """EMBEDX_DRAIN_TIMEOUT_S bounds the shutdown: a request still running then gets a 503
    it can retry elsewhere, rather than holding the process past its supervisor's grace."""
    held = BatchHold(tmp_path)
    with running_server(tmp_path, held=held, preload=MINILM_NAME, drain_timeout_s=1) as stopping:
        results: list[httpx.Response] = []
        held.hold()  # past the drain timeout
        worker = in_flight(stopping, reference_texts[:60], results)
        stopping.process.send_signal(signal.SIGTERM)
        stopping.wait_for_output("after the drain timeout: failing them")
        held.release()
        assert stopping.process.wait(PATIENCE_S) == 0
        worker.join()
        assert_envelope(results[0], 503, "shutting_down")


def test_a_client_that_never_finishes_its_request_does_not_hold_the_stop(tmp_path: Path) -> None:
    with running_server(tmp_path, drain_timeout_s=1) as stopping:
        with socket.create_connection(("127.0.0.1", stopping.port)) as held:
            held.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n")  # no end of headers
            # answered on a connection made after it: the server has accepted the held one
            assert httpx.get(stopping.url + "/health").status_code == 200
            stopping.process.send_signal(signal.SIGTERM)
            assert stopping.process.wait(PATIENCE_S) == 0
        assert "exiting without them" in stopping.output()  # not granian's 30 s for headers


def test_a_request_whose_body_stopped_arriving_does_not_hold_the_stop(tmp_path: Path) -> None:
    # bodies allowed ten minutes, and a drain as long: the stop waits for neither
    with running_server(tmp_path, body_timeout_s=600, drain_timeout_s=600) as stopping:
        with socket.create_connection(("127.0.0.1", stopping.port), timeout=60) as stalled:
            stalled.sendall(
                b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"input":'
            )  # 9 bytes of 100, and then nothing
            until_receiving(stopping, 1)
            stopping.process.send_signal(signal.SIGTERM)
            assert stopping.process.wait(PATIENCE_S) == 0
            answer = stalled.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"shutting_down" in answer


ENDLESS_RESOLVE = """
import sys, threading
import embedx.models.source as source
def endless(*args, **kwargs):
    print("resolving slowly", file=sys.stderr, flush=True)
    threading.Event().wait()  # a load that never ends (a download that hangs)
source.resolve = endless
"""


def test_a_signal_during_preload_stops_at_once_without_waiting_for_the_load(
    tmp_path: Path,
) -> None:
    """A preload can take minutes (a download, a large model): SIGTERM from a supervisor
    must not wait it out, nor for the thread still reading its weights."""
    (tmp_path / "sitecustomize.py").write_text(ENDLESS_RESOLVE)  # a load that never ends
    env = serve_environment(preload=MINILM_NAME)
    env.update(PYTHONPATH=str(tmp_path))
    process = subprocess.Popen([sys.executable, "-m", "embedx", "serve"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    assert process.stdout is not None
    try:
        for line in process.stdout:  # until the preload is under way
            if "resolving slowly" in line:
                break
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=PATIENCE_S)[0]  # the load would never end
    finally:
        process.kill()  # a no-op once it has exited
    assert process.returncode == 0, output
    assert "stopping before the port opened" in output
    assert "Traceback" not in output
