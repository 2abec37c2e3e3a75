from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from embedx import os_threads

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="names OS threads on Linux only")


def os_name() -> str:
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()


def test_embedx_threads_carry_their_names_for_the_os_too() -> None:
    seen: list[str] = []
    started = os_threads.thread(lambda *args: seen.append(os_name()), "embedx-tokenizer", 1, 2)
    started.start()
    started.join()
    assert started.daemon
    assert seen == ["embedx-tokenize"]  # the OS keeps 15 bytes
    with os_threads.executor(1, "embedx-parts") as pool:
        assert pool.submit(os_name).result() == "embedx-parts_0"
