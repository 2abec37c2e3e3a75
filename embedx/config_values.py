"""Readers of settings' values: each takes a value as a TOML file, the environment or a flag
gives it, and returns it typed, or raises ValueError saying what it expected."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

LOG_LEVELS = ("debug", "info", "warning", "error")


def boolean(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def integer(minimum: int) -> Callable[[object], int]:
    def parse(raw: object) -> int:
        if isinstance(raw, bool):
            raise ValueError("expected an integer")
        try:
            value = int(str(raw).strip()) if not isinstance(raw, int) else raw
        except ValueError:  # not int()'s "invalid literal for int() with base 10"
            raise ValueError("expected an integer") from None
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        return value

    return parse


def optional(parse: Callable[[object], Any]) -> Callable[[object], Any]:
    def wrapped(raw: object) -> Any:
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none")):
            return None
        return parse(raw)

    return wrapped


def seconds(raw: object) -> float:
    if isinstance(raw, bool):  # an int to Python: `true` in a TOML file is no duration
        raise ValueError("expected a number of seconds")
    try:
        value = float(str(raw).strip()) if not isinstance(raw, int | float) else float(raw)
    except ValueError:  # not float()'s "could not convert string to float"
        raise ValueError("expected a number of seconds") from None
    if not 0 <= value < math.inf:  # nan too: it compares false with everything
        raise ValueError("must be a finite number of seconds, 0 or more")
    return value


def positive_seconds(raw: object) -> float:
    value = seconds(raw)
    if value == 0:
        raise ValueError("must be more than 0 seconds")
    return value


def string(raw: object) -> str:
    return str(raw)


PLACEHOLDER_KEY = "change-me"  # .env.example's: a key anyone who read it knows


def api_key(raw: object) -> str | None:
    """Unset when empty. Not `optional`: there "none" means unset, and a key of "none" must
    not turn the check off unseen."""
    if raw is None:
        return None
    # stripped, as clients' headers are: a key read from a file with its newline still works
    key = str(raw).strip()
    if not key:
        return None
    if key == PLACEHOLDER_KEY:
        raise ValueError(".env.example's placeholder; set a key of your own")
    if key.lower() in ("none", "null", "false"):
        raise ValueError("that reads as no key; for none leave it empty or unset")
    return key


def log_level(raw: object) -> str:
    value = str(raw).strip().lower()
    if value not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}")
    return value


def host(raw: object) -> str:
    value = str(raw).strip()
    try:
        ipaddress.ip_address(value)
    except ValueError:  # granian binds addresses only: `localhost` failed at start-up
        raise ValueError("an IP address to bind: 127.0.0.1, 0.0.0.0, ::1 or ::") from None
    return value


def port(raw: object) -> int:
    value = integer(0)(raw)
    if value > 65535:
        raise ValueError("must be at most 65535")
    return value


def _device_key(token: str) -> str:
    token = token.strip().lower()
    if token == "cpu" or token.isdigit():
        return token
    raise ValueError(f"device {token!r} is neither a GPU index nor 'cpu'")


def devices(raw: object) -> tuple[str, ...] | None:
    if isinstance(raw, list | tuple):
        tokens = [str(t) for t in raw]
    else:
        text = str(raw).strip().lower()
        if text in ("", "auto"):
            return None
        tokens = text.split(",")
    keys = tuple(_device_key(t) for t in tokens if t.strip())
    if not keys:
        raise ValueError("names no device")
    if len(set(keys)) != len(keys):
        raise ValueError("names a device twice")
    return keys


def device_map(value_parse: Callable[[str], Any]) -> Callable[[object], dict[str, Any]]:
    def parse(raw: object) -> dict[str, Any]:
        if isinstance(raw, Mapping):
            pairs = [(str(k), str(v)) for k, v in raw.items()]
        else:
            text = str(raw).strip()
            pairs = []
            for part in filter(None, (p.strip() for p in text.split(","))):
                key, sep, value = part.partition("=")
                if not sep:
                    raise ValueError(f"{part!r} is not DEVICE=VALUE")
                pairs.append((key, value))
        parsed = {_device_key(k): value_parse(v.strip()) for k, v in pairs}
        if len(parsed) != len(pairs):
            raise ValueError("names a device twice")
        return parsed

    return parse


def positive_float(raw: str) -> float:
    value = float(raw)
    if not 0 < value < math.inf:  # nan too
        raise ValueError("must be a positive number")
    return value


def names(raw: object) -> tuple[str, ...]:
    items = raw if isinstance(raw, list | tuple) else str(raw).split(",")
    return tuple(str(item).strip() for item in items if str(item).strip())


def wrapping(raw: object) -> str:
    template = str(raw)
    if template.count("{text}") != 1:
        raise ValueError("must contain {text} exactly once")
    return template


def path(raw: object) -> Path:
    return Path(str(raw)).expanduser()
