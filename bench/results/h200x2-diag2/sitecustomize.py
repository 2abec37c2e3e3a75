# The experiments' switches, put on PYTHONPATH for load.py and the server it starts.
import gc
import os
import sys

if os.environ.get("EXP_SWITCH"):  # the interpreter's switch interval, in seconds
    sys.setswitchinterval(float(os.environ["EXP_SWITCH"]))
    print(f"EXP switch interval {sys.getswitchinterval()} in {sys.argv[:3]}", file=sys.stderr)
if os.environ.get("EXP_GC") == "off":
    gc.disable()
if os.environ.get("EXP_CALLS"):  # tokenizer calls in flight
    import embedx.models.tokenizer as tokenizer

    tokenizer.CALLS_IN_FLIGHT = int(os.environ["EXP_CALLS"])
