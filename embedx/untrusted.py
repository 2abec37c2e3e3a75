"""Strings a client sent, made safe to show in a log line or an error message: control
characters escaped, so none starts a line of its own or moves the terminal's cursor, and long
values cut with a marker, so none is written or echoed at its full size."""

from __future__ import annotations

SHOWN_CHARS = 200  # of a value echoed in a message: enough to recognise it
# Characters that end a line or reorder what follows it on screen: the C0 and C1 controls
# (Unicode's category Cc, tab aside), the line and paragraph separators, and the
# bidirectional embeddings, overrides and isolates.
_CONTROLS = [
    *range(0x00, 0x09),
    *range(0x0A, 0x20),
    *range(0x7F, 0xA0),
    0x2028,
    0x2029,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_ESCAPED = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _CONTROLS}


def escaped(text: str) -> str:
    """`text` with its control characters written as escapes (`\\n` as `\\x0a`)."""
    return text.translate(_ESCAPED)


def clipped(text: str, limit: int) -> str:
    """`text`, cut past `limit` characters with a marker saying how much was."""
    return text if len(text) <= limit else f"{text[:limit]}…(+{len(text) - limit} chars)"


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """`value`, cut past `limit` characters, its control characters escaped."""
    return escaped(clipped(value, limit))
