from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from embedx.config import load_settings
from embedx.devices import (
    CpuAccelerator,
    CudaAccelerator,
    CudaLaunch,
    discover,
    token_budget,
)
from embedx.errors import ConfigError, DeviceHung
from tests.support.fakes import cpu_info
from tests.support.waiting import PATIENCE_S, eventually_async

pytestmark = pytest.mark.anyio


def test_with_no_gpu_the_cpu_serves() -> None:
    devices = discover(load_settings(environ={}))
    assert [d.label for d in devices] == ["cpu"]
    assert devices[0].multiprocessors >= 1
    assert devices[0].total_memory > 0


def test_naming_a_gpu_that_is_not_there_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="GPU 7"):
        discover(load_settings(environ={"EMBEDX_DEVICES": "7,cpu"}))


def test_device_weights_replace_the_static_score() -> None:
    settings = load_settings(environ={"EMBEDX_DEVICE_WEIGHTS": "cpu=3.5"})
    assert discover(settings)[0].score == 3.5
    with pytest.raises(ConfigError, match="not served"):
        discover(load_settings(environ={"EMBEDX_DEVICE_WEIGHTS": "0=1"}))


def test_a_per_device_budget_for_a_device_not_served_is_refused() -> None:
    assert discover(load_settings(environ={"EMBEDX_DEVICE_BATCH_TOKENS": "cpu=2048"}))
    with pytest.raises(ConfigError, match="EMBEDX_DEVICE_BATCH_TOKENS names devices not served"):
        discover(load_settings(environ={"EMBEDX_DEVICE_BATCH_TOKENS": "0=16384"}))


def test_budget_comes_from_free_memory_and_bytes_per_token() -> None:
    # 10 GiB free, 85% usable, 2 batches in flight of 20 KiB a token
    budget = token_budget(10 << 30, 20 * 1024, 2, cap=1 << 30)
    assert budget == int((10 << 30) * 0.85 / (20 * 1024 * 2))
    assert token_budget(10 << 30, 20 * 1024, 2, cap=16384) == 16384
    assert token_budget(1 << 20, 20 * 1024, 2, cap=16384) == 256  # never below a floor
    assert token_budget(10 << 30, 20 * 1024, 2, cap=16384, override=999) == 999


async def test_the_cpu_runs_work_on_its_thread_and_reports_the_time() -> None:
    accelerator = CpuAccelerator(cpu_info())
    started, released = threading.Event(), threading.Event()

    def work() -> str:  # runs until the event loop, still free, lets it end
        started.set()
        assert released.wait(PATIENCE_S)
        return threading.current_thread().name

    launched = accelerator.launch(work)
    await eventually_async(started.is_set)
    assert not launched.future.done()
    released.set()
    output, seconds = await accelerator.result(launched, PATIENCE_S)
    assert output.startswith("embedx-cpu")
    assert seconds > 0
    accelerator.close()


async def test_a_batch_past_its_deadline_raises_device_hung() -> None:
    accelerator = CpuAccelerator(cpu_info("slowpoke"))
    released = threading.Event()
    launched = accelerator.launch(lambda: released.wait(PATIENCE_S))  # hangs till released
    with pytest.raises(DeviceHung, match="slowpoke"):
        await accelerator.result(launched, 0.05)
    released.set()
    accelerator.close()


class _DoneIn:
    """Stands for a CUDA event that completes `seconds` after it is made."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def query(self) -> bool:
        return time.monotonic() >= self.at

    def elapsed_time(self, _end: object) -> float:
        return 100.0  # milliseconds, as CUDA events report them


def test_awaiting_a_gpu_batch_sleeps_between_polls_on_uvloop() -> None:
    # uvloop rounds timers to whole milliseconds: a shorter poll step spun the loop's thread
    # at 100% for as long as a batch ran, starving the tokenizer's and the HTTP threads.
    import uvloop

    accelerator = object.__new__(CudaAccelerator)  # no GPU needed to await an event
    accelerator.info = cpu_info("gpu")
    launch = CudaLaunch("rows", _DoneIn(0.0), _DoneIn(0.1), time.monotonic())

    async def await_batch() -> tuple[str, float, float]:
        cpu = time.thread_time()
        output, seconds = await accelerator.result(launch, 5.0)
        return output, seconds, time.thread_time() - cpu

    output, seconds, cpu_s = uvloop.run(await_batch())
    assert (output, seconds) == ("rows", 0.1)
    assert cpu_s < 0.03  # a spinning loop burns the whole 0.1 s


async def test_a_gpu_whose_batch_hung_is_closed_without_waiting_for_it() -> None:
    accelerator = object.__new__(CudaAccelerator)  # no GPU needed: the event never completes
    accelerator.info = cpu_info("gpu")
    accelerator.hung = False
    emptied: list[bool] = []
    accelerator.release_cached_memory = lambda: emptied.append(True)  # type: ignore[method-assign]
    launch = CudaLaunch("rows", _DoneIn(0.0), _DoneIn(3600.0), time.monotonic())
    with pytest.raises(DeviceHung):
        await accelerator.result(launch, 0.05)
    accelerator.close()  # synchronizing would wait for the hung kernel: for ever
    assert not emptied


@pytest.mark.process
def test_a_cpu_accelerator_turns_off_onednn_primitive_caching_unless_set() -> None:
    """Batches come in every shape; oneDNN's per-shape cache grew a CPU process without end
    (MiniLM, 240 requests of 100 texts). Importing embedx leaves the environment alone."""
    code = (
        "import os, embedx\n"
        "from embedx.devices import CpuAccelerator, DeviceInfo\n"
        "print(os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'))\n"
        "CpuAccelerator(DeviceInfo('cpu', 'cpu', 'cpu', 1 << 34, 1 << 34, 2, None, 1.0))\n"
        "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"
    )
    clean = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    for preset, expected in ((None, ["None", "0"]), ("64", ["64", "64"])):
        env = clean if preset is None else {**clean, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": preset}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.stdout.split() == expected, done.stderr
