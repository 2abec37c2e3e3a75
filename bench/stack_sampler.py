"""Where a Python process spends its time, by sampling every thread's stack.

    python bench/stack_sampler.py OUT MODULE [ARG ...]

Runs MODULE as `python -m MODULE ARG ...` would, while a background thread records each
thread's Python stack about every millisecond. At exit (SIGTERM included) OUT gets, per
thread, the functions most often on top of the stack (self) and anywhere on it (inclusive).
Unlike cProfile it sees every thread and Python code called from C (an event loop's
callbacks). Read shares, not times: the interpreter's switch interval is shortened so a
busy thread lets the sampler in, which slows the process a little; and time in C shows as
the Python function that called it (an idle uvloop and its own work both show as
`runners.py:run`).
"""

from __future__ import annotations

import atexit
import collections
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

INTERVAL_S = 0.001


def where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{Path(code.co_filename).name}:{code.co_firstlineno}:{code.co_name}"


def main() -> None:
    out, module, *args = sys.argv[1:]
    own: collections.Counter[tuple[str, str]] = collections.Counter()
    inclusive: collections.Counter[tuple[str, str]] = collections.Counter()
    samples: collections.Counter[str] = collections.Counter()
    running = True

    def sample() -> None:
        me = threading.get_ident()
        while running:
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                thread = names.get(ident, str(ident))
                samples[thread] += 1
                own[thread, where(frame)] += 1
                seen = set()
                current: FrameType | None = frame
                while current is not None:
                    seen.add(where(current))
                    current = current.f_back
                for name in seen:
                    inclusive[thread, name] += 1
            time.sleep(INTERVAL_S)

    def report() -> None:
        nonlocal running
        running = False
        lines = []
        for thread, count in samples.most_common():
            lines.append(f"== thread {thread}: {count} samples")
            for title, table in (("self", own), ("inclusive", inclusive)):
                lines.append(f"-- {title}")
                rows = sorted(((n, k[1]) for k, n in table.items() if k[0] == thread), reverse=True)
                lines += [f"{100 * n / count:6.1f}%  {name}" for n, name in rows[:35]]
        Path(out).write_text("\n".join(lines) + "\n")

    sys.setswitchinterval(INTERVAL_S / 10)  # a busy thread lets the sampler in on time
    threading.Thread(target=sample, name="stack-sampler", daemon=True).start()
    atexit.register(report)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # until the module sets its own
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
