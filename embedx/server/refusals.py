"""Requests refused before their body is read: one whose target is no path, any but /health's
while the server drains, and one without the API key (EMBEDX_API_KEY)."""

from __future__ import annotations

import hmac

from embedx.errors import AuthenticationFailed, EmbedxError, InvalidRequest, ShuttingDown
from embedx.server.asgi import Scope, header

OPEN_PATHS = frozenset({"/health"})  # taken while draining, and without a key


class Refusals:
    def __init__(self, api_key: str | None) -> None:
        self._key = api_key.encode() if api_key else None

    def check(self, scope: Scope, *, draining: bool) -> None:
        """Raise the request's refusal, if it gets one."""
        path: str = scope["path"]
        if not path.startswith("/"):  # CONNECT host:port, say: no route could take it
            raise InvalidRequest("the request target must be a path")
        if draining and path not in OPEN_PATHS:
            raise ShuttingDown("the server is shutting down; send the request to another replica")
        if self._key is not None and path not in OPEN_PATHS:
            refusal = _key_refusal(scope, self._key)
            if refusal is not None:
                raise refusal


def _key_refusal(scope: Scope, key: bytes) -> EmbedxError | None:
    given = header(scope, b"authorization")
    if given is None:
        return AuthenticationFailed("missing API key: send `Authorization: Bearer <key>`")
    scheme, _, sent = given.strip().partition(b" ")
    if scheme.lower() != b"bearer":  # schemes are case-insensitive (RFC 9110)
        return AuthenticationFailed("send the API key as `Authorization: Bearer <key>`")
    if not hmac.compare_digest(sent.strip(), key):
        return AuthenticationFailed("wrong API key")
    return None
