"""The collector tuning a loaded model brings (a frozen heap, a raised young threshold): none
in a process that has not opted in, as a program using the library has not; `embedx serve`
opts in (the tuning itself: test_engine.py)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest

from embedx import heap

pytestmark = pytest.mark.anyio


async def test_loading_a_model_leaves_the_collector_alone_unless_the_process_opts_in(
    make_engine: Callable[..., Any],
) -> None:
    threshold = gc.get_threshold()
    frozen = gc.get_freeze_count()
    async with make_engine(("cpu",)):
        assert gc.get_threshold() == threshold
        assert gc.get_freeze_count() == frozen
    heap.manage()
    try:
        async with make_engine(("cpu",)):
            assert gc.get_threshold() == (heap.YOUNG_OBJECTS, *threshold[1:])
            assert gc.get_freeze_count() > frozen
    finally:
        heap.manage(False)
    assert gc.get_threshold() == threshold


def test_serve_opts_the_process_in(monkeypatch: pytest.MonkeyPatch) -> None:
    from embedx.config import load_settings
    from embedx.server import logs, run

    opted: list[bool] = []
    monkeypatch.setattr(heap, "manage", lambda enabled=True: opted.append(enabled))
    monkeypatch.setattr(run, "_serve", _stopped_at_once)
    monkeypatch.setattr(logs, "configure", lambda level: None)  # this process's logging
    assert run.serve(load_settings({}, environ={})) == 0
    assert opted == [True]


async def _stopped_at_once(settings: object) -> int:
    return 0
