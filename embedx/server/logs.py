"""The server's log: one line a record, whatever a client sent that reached it."""

from __future__ import annotations

import logging

from embedx.untrusted import clipped, escaped

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_LINE_CHARS = 8192  # a record's line, before its traceback


class OneLineFormatter(logging.Formatter):
    """Writes each record's line with its control characters escaped and cut at
    MAX_LINE_CHARS, so that no value in it (a model name, a path) can forge a line of its
    own or fill the disk; a traceback, which the server writes itself, follows as usual."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # logging's name
        return clipped(escaped(super().formatMessage(record)), MAX_LINE_CHARS)


def configure(level: str) -> None:
    """Send every logger's records to stderr, one line each, from `level` up."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
