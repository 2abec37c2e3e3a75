"""Waiting for what the code under test sets: poll a condition until it holds, with a deadline
so generous that only a condition that never comes fails it, however busy the machine."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

# Far past anything a quiet machine needs (milliseconds to seconds): the suite runs beside
# others on two shared cores, where a step of a second can take a minute.
PATIENCE_S = 120.0
_STEP_S = 0.01

T = TypeVar("T")


def eventually(condition: Callable[[], T], *, within: float = PATIENCE_S, message: str = "") -> T:
    """The condition's first truthy value, polled until it comes; AssertionError (saying
    `message`) if it has not within `within` seconds."""
    deadline = time.monotonic() + within
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(message or f"not within {within:g} s: {condition}")
        time.sleep(_STEP_S)  # between looks at the condition: a poll, not a fixed wait
    return value


@overload
async def eventually_async(
    condition: Callable[[], Awaitable[T]], *, within: float = ..., message: str = ...
) -> T: ...


@overload
async def eventually_async(
    condition: Callable[[], T], *, within: float = ..., message: str = ...
) -> T: ...


async def eventually_async(
    condition: Callable[[], Any], *, within: float = PATIENCE_S, message: str = ""
) -> Any:
    """`eventually` on the event loop, which runs on between polls; the condition may be a
    coroutine function (a request to the app, say)."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message or f"not within {within:g} s: {condition}")
        await asyncio.sleep(_STEP_S)  # the loop runs on between looks: a poll


async def until(event: asyncio.Event, *, within: float = PATIENCE_S, message: str = "") -> None:
    """Wait for `event`, the code under test's signal; AssertionError if it is not set within
    `within` seconds (rather than the test hanging to the suite's timeout)."""
    try:
        await asyncio.wait_for(event.wait(), within)
    except TimeoutError:
        raise AssertionError(message or f"not set within {within:g} s: {event}") from None


async def next_turn() -> None:
    """One turn of the event loop: each task ready now takes its next step, in order. A yield,
    not a wait for time (asyncio.sleep(0) is asyncio's way to yield): for a test about the
    order in which tasks step."""
    await asyncio.sleep(0)
