# The experiments' switches, put on PYTHONPATH for load.py and the server it starts.
import asyncio
import os
import sys
import time

if os.environ.get("EXP_POLL"):  # the CUDA event polling step, in seconds
    import embedx.devices as devices

    devices.POLL_S = float(os.environ["EXP_POLL"])
    print(f"EXP poll {devices.POLL_S} in {sys.argv[:2]}", file=sys.stderr)
if os.environ.get("EXP_POLL_FROM"):  # 0: poll from launch, as before 'due' polling
    import embedx.devices as devices

    devices.POLL_FROM = float(os.environ["EXP_POLL_FROM"])
    print(f"EXP poll from {devices.POLL_FROM} in {sys.argv[:2]}", file=sys.stderr)
if os.environ.get("EXP_SYNC") or os.environ.get("EXP_STEP"):
    import embedx.models.tokenizer as tokenizer

    cls = tokenizer.TextTokenizer
    if os.environ.get("EXP_SYNC"):  # encode_batch_fast in a worker thread (rayon) instead
        init = cls.__init__

        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self._async = False

        cls.__init__ = __init__
    if os.environ.get("EXP_STEP"):  # while a call runs, hand the GIL over every S seconds
        every = float(os.environ["EXP_STEP"])
        call_next = cls._call_next

        def _call_next(self):
            call_next(self)
            if self._calling and not getattr(self, "_stepping", False):
                self._stepping = True
                loop = asyncio.get_running_loop()

                def step():
                    if not self._calling:
                        self._stepping = False
                        return
                    time.sleep(0)
                    loop.call_later(every, step)

                loop.call_later(every, step)

        cls._call_next = _call_next
    print(
        f"EXP sync={os.environ.get('EXP_SYNC')} step={os.environ.get('EXP_STEP')}",
        f"in {sys.argv[:2]}",
        file=sys.stderr,
    )
