"""The field types a request table is written in: each reads a value, or refuses it with a
400 naming the field, and states the JSON Schema of the values it takes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from embedx.errors import InvalidOption
from embedx.untrusted import shown

DURATION = re.compile(r"^ *([0-9]+(?:\.[0-9]+)?) *([smh]?) *$")
MAX_DURATION = 32  # characters: a duration this long still counts finite seconds
SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True, slots=True)
class Choice:
    """One of a few strings."""

    values: tuple[str, ...]
    default: str | None = None

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values)}

    def read(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or value not in self.values:
            raise InvalidOption(f"`{key}` must be one of {', '.join(self.values)}", param=key)
        return value


@dataclass(frozen=True, slots=True)
class Choices:
    """A list of some of a few strings, each once, at least one."""

    values: tuple[str, ...]
    default: None = None

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "items": {"type": "string", "enum": list(self.values)},
                "minItems": 1, "uniqueItems": True}  # fmt: skip

    def read(self, value: Any, key: str) -> tuple[str, ...]:
        accepted = ", ".join(self.values)
        if not isinstance(value, list) or not value:
            raise InvalidOption(f"`{key}` must be a list of some of {accepted}", param=key)
        for item in value:
            if not isinstance(item, str) or item not in self.values:
                given = f"`{shown(item)}`" if isinstance(item, str) else "a value that is not one"
                raise InvalidOption(
                    f"`{key}` holds {given}; each must be one of {accepted}", param=key
                )
        if len(set(value)) < len(value):
            raise InvalidOption(f"`{key}` names a value twice; name each once", param=key)
        return tuple(value)


@dataclass(frozen=True, slots=True)
class Integer:
    """A whole number, `minimum` or more (1.0 is one, as JSON Schema counts it)."""

    minimum: int
    default: None = None

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.minimum}

    def read(self, value: Any, key: str) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            raise InvalidOption(f"`{key}` must be an integer of {self.minimum} or more", param=key)
        return value


@dataclass(frozen=True, slots=True)
class Flag:
    """true or false."""

    default: bool | None = None

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}

    def read(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise InvalidOption(f"`{key}` must be true or false", param=key)
        return value


@dataclass(frozen=True, slots=True)
class Text:
    """A string, of `shortest` to `longest` characters (as JSON Schema counts them)."""

    shortest: int = 0
    longest: int | None = None
    default: None = None

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        if self.shortest:
            schema["minLength"] = self.shortest
        if self.longest is not None:
            schema["maxLength"] = self.longest
        return schema

    def read(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise InvalidOption(f"`{key}` must be a string", param=key)
        if len(value) < self.shortest:
            raise InvalidOption(
                f"`{key}` must be at least {self.shortest} characters long", param=key
            )
        if self.longest is not None and len(value) > self.longest:
            raise InvalidOption(
                f"`{key}` is {len(value)} characters long; at most {self.longest} are taken",
                param=key,
            )
        return value


@dataclass(frozen=True, slots=True)
class Duration:
    """Seconds, as a number or a string like "90s", "10m", "1h"."""

    default: None = None

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [{"type": "number", "minimum": 0},
                          {"type": "string", "pattern": DURATION.pattern,
                           "maxLength": MAX_DURATION}]}  # fmt: skip

    def read(self, value: Any, key: str) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value)
        # fullmatch: `$` alone would let a trailing newline through, which ECMA's does not
        match = DURATION.fullmatch(value) if isinstance(value, str) else None
        if match and len(value) <= MAX_DURATION:
            return float(match.group(1)) * SECONDS[match.group(2)]
        raise InvalidOption(f"`{key}` must be seconds, or a duration like 90s, 10m, 1h", param=key)


Option = Choice | Choices | Integer | Flag | Text | Duration
