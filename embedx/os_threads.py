"""embedx's threads, named for the OS as for Python (Linux), so that `top -H`, `py-spy` and
/proc/PID/task/*/comm say which of them is busy: the tokenizer, a device, a writer."""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PR_SET_NAME = 15  # prctl's option: the calling thread's name, 15 bytes and a NUL at most


def thread(target: Callable[..., object], name: str, *args: Any) -> threading.Thread:
    """A daemon thread (not started) that runs `target(*args)` under `name`, the OS's too."""

    def run() -> None:
        name_os_thread()
        target(*args)

    return threading.Thread(target=run, name=name, daemon=True)


def executor(workers: int | None, prefix: str) -> ThreadPoolExecutor:
    """A pool of up to `workers` threads named `prefix`_N, for the OS too."""
    return ThreadPoolExecutor(workers, thread_name_prefix=prefix, initializer=name_os_thread)


def name_os_thread() -> None:
    """Give the calling thread's Python name to its OS thread (cut to 15 bytes), where the C
    library has prctl: a name is a help, so its absence costs the thread nothing."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_NAME, ctypes.c_char_p(threading.current_thread().name.encode()[:15]), 0, 0, 0)


@functools.cache
def _prctl() -> Callable[..., int] | None:
    if sys.platform != "linux":
        return None
    try:
        return getattr(ctypes.CDLL(None), "prctl", None)
    except OSError:  # no C library to open (a static build)
        return None
