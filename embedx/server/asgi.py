"""ASGI's types, as the server's layers pass requests between them, and a header's lookup."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of the request header `name` (lowercase), if it has one."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None
