# On PYTHONPATH for load.py and the server it starts: the tokenizer runs encode_batch_fast on
# a worker thread (as EXP_SYNC did in h200x2-diag3), and every call's clocks go to
# $TOKCALLS-<pid>.jsonl: queued on the loop, started and finished on the thread (with the
# process's CPU seconds then), and handed out on the loop.
import json
import os
import threading
import time

import embedx.models.tokenizer as tokenizer

cls = tokenizer.TextTokenizer
path = f"{os.environ['TOKCALLS']}-{os.getpid()}.jsonl"
lock = threading.Lock()


class Timed:
    def __init__(self, inner, calls):
        self._inner = inner
        self._calls = calls

    def encode_batch_fast(self, texts):
        began, cpu0 = time.perf_counter(), time.process_time()
        out = self._inner.encode_batch_fast(texts)
        self._calls.append(
            {
                "texts": len(texts),
                "began": began,
                "ended": time.perf_counter(),
                "cpu_s": time.process_time() - cpu0,
            }
        )
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)


init = cls.__init__


def __init__(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self._async = False
    self._timed_calls = []
    self._queued_at = []
    self._tokenizer = Timed(self._tokenizer, self._timed_calls)


call_next = cls._call_next


def _call_next(self):
    calls = self.calls
    call_next(self)
    if self.calls > calls:
        self._queued_at.append(time.perf_counter())


hand_out = cls._hand_out


def _hand_out(self, batch, call):
    now = time.perf_counter()
    hand_out(self, batch, call)
    if self._timed_calls and self._queued_at:
        row = self._timed_calls.pop(0)
        row["queued"] = self._queued_at.pop(0)
        row["handed_out"] = now
        with lock, open(path, "a") as out:
            out.write(json.dumps(row) + "\n")


cls.__init__ = __init__
cls._call_next = _call_next
cls._hand_out = _hand_out
