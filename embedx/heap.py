"""What Python's cyclic garbage collector scans: nothing new over a burst of allocations,
and, in a process that opts in (`manage`: `embedx serve` does), nothing that was alive when
the last model finished loading, and young objects only once tens of thousands have piled up,
while any model is loaded.

An embed over 39,646 texts makes tens of thousands of work records that live until it ends,
so a full collection came once a call, scanning every object in the process (torch's and
transformers' modules, the models): 0.10 to 0.12 s of the 2-core machine's host-bound
embed, with the interpreter lock held, against 0.02 s with the heap frozen
(fake devices that compute nothing). Reference counting frees everything as usual either way.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# Tracked objects allocated, net of those freed, between young collections while a model is
# loaded. Python's 700 suits objects that die young; an engine keeps a work record per
# queued text for its request's life, tens of thousands at a time, and collections every
# 700 scanned them, promoted them and escalated to full ones. MiniLM on an H200 host, two
# rounds: the server 6 to 8% faster with this, the library 7 to 23%
# (bench/load.py, against 700).
YOUNG_OBJECTS = 50_000
_managed = False  # whether loading a model may tune this process's collector (`manage`)
_models = 0  # models loaded in this process (engines, each Embedder's or the server's)
_young_before: int | None = None  # the threshold `hold` raised, for the last `release`


def manage(enabled: bool = True) -> None:
    """Let loading a model freeze the heap and raise the young threshold (`hold`), from now
    on. The collector is the whole process's, so the process's owner decides: `embedx serve`
    does this; a program embedding with the library may, before it loads a model."""
    global _managed
    _managed = enabled


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


def hold() -> bool:
    """A model finished loading: freeze the heap, and young collections wait for
    YOUNG_OBJECTS new objects (unless collection is off) until the last model is released.
    Whether it did (in a process that opted in, `manage`): only a model that held it calls
    `release`."""
    global _models, _young_before
    if not _managed:
        return False
    _models += 1
    young, *older = gc.get_threshold()
    if 0 < young < YOUNG_OBJECTS:
        _young_before = young
        gc.set_threshold(YOUNG_OBJECTS, *older)
    freeze()
    return True


def freeze() -> None:
    """Collect what is garbage now, then leave every object alive out of later collections
    (`gc.freeze`): once a model is loaded, most of the process is here to stay. Only in a
    process that opted in (`manage`)."""
    if not _managed:
        return
    gc.collect()
    gc.freeze()


def release() -> None:
    """A model closed: collections scan everything again, so that its objects, if any of
    them hold each other in a cycle, are freed by the next full collection rather than never
    (`freeze` again once they are gone keeps the other models' out). The young threshold
    goes back to what it was once no model is left."""
    global _models, _young_before
    _models = max(0, _models - 1)
    gc.unfreeze()
    if _models:
        return
    young, *older = gc.get_threshold()
    if _young_before is not None and young == YOUNG_OBJECTS:
        gc.set_threshold(_young_before, *older)
    _young_before = None
