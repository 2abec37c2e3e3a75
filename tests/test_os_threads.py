from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

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


def test_a_thread_runs_even_where_the_os_takes_no_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_c_library(*args: Any) -> None:
        raise OSError("no C library to open")

    os_threads._prctl.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", no_c_library)
    try:
        ran: list[str] = []
        started = os_threads.thread(ran.append, "embedx-tokenizer", "ran")
        started.start()
        started.join()
        assert ran == ["ran"]
        with os_threads.executor(1, "embedx-parts") as pool:
            assert pool.submit(len, "four").result() == 4
    finally:
        os_threads._prctl.cache_clear()


def test_the_tokenizer_library_s_workers_carry_the_tokenizer_s_name(minilm_dir: Path) -> None:
    # In a process of its own: the workers are made once a process, by the first parallel call.
    script = """
import os, sys
from pathlib import Path
from embedx.models.source import resolve
from embedx.models.tokenizer import TextTokenizer
tokenizer = TextTokenizer(resolve(sys.argv[1]), 128)
tokenizer.encode_now(["a small request, tokenized where it is asked"] * 64)
tasks = Path("/proc/self/task")
names = [(tasks / t / "comm").read_text().strip() for t in os.listdir(tasks)]
print(names.count("embedx-tokenize"))
"""
    env = {**os.environ, "RAYON_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "true"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(minilm_dir)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2"]
