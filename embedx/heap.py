"""What Python's cyclic garbage collector scans: nothing new over a burst of allocations, and
nothing that was alive when the last model finished loading.

An embed over 39,646 texts makes tens of thousands of work records that live until it ends,
so a full collection came once a call, scanning every object in the process (torch's and
transformers' modules, the models): 0.10 to 0.12 s of the 2-core machine's host-bound
embed, with the interpreter lock held, against 0.02 s with the heap frozen
(`bench/host_only.py`). Reference counting frees everything as usual either way.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector over a burst of allocations with no await inside.

    Building tens of thousands of work records otherwise triggers repeated full collections
    that scan every live object.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def freeze() -> None:
    """Collect what is garbage now, then leave every object alive out of later collections
    (`gc.freeze`): once a model is loaded, most of the process is here to stay."""
    gc.collect()
    gc.freeze()


def thaw() -> None:
    """Let collections scan everything again: a closed model's objects, if any of them hold
    each other in a cycle, are freed by the next full collection rather than never."""
    gc.unfreeze()
