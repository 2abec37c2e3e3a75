"""CORS: which origin a request's answer names (EMBEDX_CORS_ALLOW_ORIGINS), the headers that
tell a browser page on it what it may read, and the answer to its preflight."""

from __future__ import annotations

from embedx.server.asgi import Scope, header

# What a browser page on an allowed origin may send and read.
METHODS = b"GET, POST"
EXPOSED = b"x-request-id, x-tokenization-time, x-inference-time, x-total-time, x-total-tokens"
MAX_AGE = b"600"  # seconds a browser may reuse a preflight's answer


class Cors:
    def __init__(self, origins: tuple[str, ...]) -> None:
        self._any = "*" in origins
        self._origins = frozenset(origin.rstrip("/").encode() for origin in origins)

    def allowed_origin(self, scope: Scope) -> bytes | None:
        """The value of `access-control-allow-origin` this request gets, if any."""
        if not (self._any or self._origins):
            return None
        origin = header(scope, b"origin")
        if origin is None:
            return None
        return b"*" if self._any else origin if origin in self._origins else None


def headers(origin: bytes | None) -> list[tuple[bytes, bytes]]:
    """The headers every answer to a page on `origin` carries (none for no allowed origin)."""
    if origin is None:
        return []
    tags = [(b"access-control-allow-origin", origin), (b"access-control-expose-headers", EXPOSED)]
    if origin != b"*":  # the answer depends on the request's origin: caches must know
        tags.append((b"vary", b"origin"))
    return tags


def is_preflight(scope: Scope) -> bool:
    asked = header(scope, b"access-control-request-method")
    return scope["method"] == "OPTIONS" and asked is not None


def preflight_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """A preflight's 204: the methods, and the headers it asked to send (Authorization among
    them, which no wildcard covers)."""
    asked = header(scope, b"access-control-request-headers")
    return [
        (b"access-control-allow-methods", METHODS),
        (b"access-control-max-age", MAX_AGE),
        *([(b"access-control-allow-headers", asked)] if asked else []),
    ]
