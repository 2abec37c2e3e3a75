"""A request's body: its bytes of EMBEDX_MAX_BODY_BYTES_IN_FLIGHT reserved before it is read
and held until its answer, the body read whole within EMBEDX_MAX_REQUEST_BYTES and its
deadline (EMBEDX_BODY_TIMEOUT_S a MB), and, after one of megabytes, the memory given back."""

from __future__ import annotations

import asyncio

from embedx.allocator import GIVE_BACK_AFTER_BYTES, give_back_soon
from embedx.config import Settings
from embedx.errors import BodyTimeout, PayloadTooLarge
from embedx.server.admission import Budget
from embedx.server.asgi import Receive, Scope, header
from embedx.server.disconnect import ClientGone


class Body:
    __slots__ = ("_budget", "_settings", "reserved", "size")

    def __init__(self, budget: Budget, settings: Settings) -> None:
        self._budget = budget
        self._settings = settings
        self.reserved = 0  # bytes of the budget this request holds
        self.size = 0

    async def read(self, scope: Scope, receive: Receive) -> bytes:
        """The whole body, once its bytes fit the budget: a body of declared length reserves
        that length, a chunked one the largest a body may be (less, once it is in)."""
        limit = self._settings.max_request_bytes
        declared = _declared_length(scope, limit)
        self.reserved = await self._budget.reserve(limit if declared is None else declared)
        body = await _arrived(receive, declared, limit, self._settings.body_timeout_s)
        if len(body) < self.reserved:  # a chunked body, shorter than the largest one
            self._budget.release(self.reserved - len(body))
            self.reserved = len(body)
        self.size = len(body)
        return body

    def release(self) -> None:
        """The request is done: its bytes go back to the budget; after a body of megabytes,
        the allocator gives the memory back (on the loop's next turn: once the request's
        frame, and the body with it, are gone)."""
        self._budget.release(self.reserved)
        self.reserved = 0
        if self.size >= GIVE_BACK_AFTER_BYTES:
            asyncio.get_running_loop().call_soon(give_back_soon)


def _declared_length(scope: Scope, limit: int) -> int | None:
    """The body's length, as its headers give it; None for a chunked one, which says
    nothing in advance. One over the limit is refused unread."""
    if header(scope, b"transfer-encoding") is not None:  # it overrides a content-length
        return None
    declared = header(scope, b"content-length")
    size = int(declared) if declared is not None and declared.isdigit() else 0
    if size > limit:
        raise _too_large(size, limit)
    return size


async def _arrived(receive: Receive, declared: int | None, limit: int, per_mb: float) -> bytes:
    """The whole body, read by a deadline of `per_mb` seconds for each MB of it (at least that
    much for any body): set at once for a body of declared length, and moved on as a chunked
    body's bytes arrive. A client that sends slower gets a 408, and its connection is closed:
    otherwise slow clients would hold connections as long as they liked. The deadline cancels
    the await on the server's read (granian's RSGI drops its read of the body then)."""
    started = asyncio.get_running_loop().time()
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout_at(started + _allowed_s(declared or 0, per_mb)) as timer:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:  # a chunked body says nothing in advance: count as it comes
                    raise _too_large(size, limit)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
                if declared is None:
                    timer.reschedule(started + _allowed_s(size, per_mb))
    except TimeoutError:
        allowed = _allowed_s(declared if declared is not None else size, per_mb)
        raise BodyTimeout(
            f"the request body did not arrive within {allowed:g} s "
            f"(EMBEDX_BODY_TIMEOUT_S: {per_mb:g} s for each MB, and at least that)"
        ) from None


def _allowed_s(size: int, per_mb: float) -> float:
    return per_mb * max(1.0, size / 1e6)


def _too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body has {size} bytes or more; "
        f"the limit is {limit} (EMBEDX_MAX_REQUEST_BYTES)"
    )
