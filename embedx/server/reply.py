"""One request's send channel: tags its response (the request id, CORS headers), remembers
its status and error code, sends a HEAD request the headers alone, and writes the answers the
guard makes itself (an error's envelope, a preflight's 204)."""

from __future__ import annotations

from embedx.errors import EmbedxError
from embedx.server.asgi import Message, Send
from embedx.server.responses import error_body


class Reply:
    __slots__ = ("_head", "_send", "_tags", "code", "started", "status")

    def __init__(self, send: Send, tags: list[tuple[bytes, bytes]], *, head: bool) -> None:
        self._send = send
        self._tags = tags
        self._head = head  # its content-length still the body's
        self.status = 500
        self.code: str | None = None  # the error's, where the answer is one
        self.started = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.status = message["status"]
            message["headers"] = [*message.get("headers", []), *self._tags]
        elif self._head:
            message = {**message, "body": b""}
        await self._send(message)

    async def error(self, error: EmbedxError) -> None:
        """The error's envelope, with its status and headers; too late for it once the
        response has started (the log has the error)."""
        if self.started:
            return
        self.code = error.code
        status, headers, body = error_body(error)
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    async def empty(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": b""})
