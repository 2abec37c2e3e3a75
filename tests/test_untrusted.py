"""Client-supplied strings are escaped and bounded before a log line or a message shows them."""

from __future__ import annotations

import logging

from embedx.server.logs import MAX_LINE_CHARS, OneLineFormatter
from embedx.untrusted import SHOWN_CHARS, shown


def test_control_characters_are_escaped_and_printable_text_is_kept() -> None:
    assert shown("org/model-1.5") == "org/model-1.5"
    assert shown("a\nb\rc\x1b[31md\x85e\u2028f\u202eg\th") == (
        "a\\x0ab\\x0dc\\x1b[31md\\x85e\\u2028f\\u202eg\th"
    )
    assert shown("名前 ✓") == "名前 ✓"


def test_a_long_value_is_cut_with_a_marker_that_says_how_much() -> None:
    cut = shown("x" * 30_000_000)
    assert cut == "x" * SHOWN_CHARS + f"…(+{30_000_000 - SHOWN_CHARS} chars)"


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("embedx.registry", logging.INFO, __file__, 1, message, args, None)


def test_a_log_record_is_one_line_whatever_its_values_hold() -> None:
    formatter = OneLineFormatter("%(levelname)s %(name)s: %(message)s")
    forged = "m\n2026-12-06 12:00:00,000 ERROR embedx.server: forged"
    line = formatter.format(record("loading %s failed: %s", forged, "no such model"))
    assert "\n" not in line
    assert line == (
        "INFO embedx.registry: loading m\\x0a2026-12-06 12:00:00,000 ERROR embedx.server: "
        "forged failed: no such model"
    )
    huge = formatter.format(record("loading %s failed", "n" * 60_000_000))
    assert len(huge) < MAX_LINE_CHARS + 30
    assert huge.endswith(" chars)")


def test_a_traceback_keeps_its_lines() -> None:
    formatter = OneLineFormatter("%(message)s")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        failed = record("request failed")
        failed.exc_info = sys.exc_info()
    text = formatter.format(failed)
    assert text.startswith("request failed\nTraceback (most recent call last):\n")
