"""The models catalog: names an operator (or embedx itself) has described once, with their source,
pooling, dtype, length, keep-alive and prompt templates."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from embedx.errors import ConfigError, InvalidOption
from embedx.models.pooling import Pooling
from embedx.models.prompts import MAX_INSTRUCTION, Template

DTYPES = ("auto", "float32", "float16", "bfloat16")
IMPLEMENTATIONS = ("auto", "native", "transformers")


def check_dtype(value: str, param: str = "dtype") -> str:
    if value not in DTYPES:
        raise InvalidOption(f"dtype {value!r} is not one of {', '.join(DTYPES)}", param=param)
    return value


def check_template(template: str, param: str) -> str:
    if template.count("{text}") != 1:
        raise InvalidOption(f"{param} must contain {{text}} exactly once", param=param)
    return template


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Everything stated about a model before it loads. Unset fields take defaults at load."""

    name: str
    source: str  # a Hugging Face repo id, a local directory, or "package:<python module>"
    revision: str | None = None
    pooling: Pooling | None = None
    dtype: str = "auto"
    max_seq_len: int | None = None
    keep_alive_s: float | None = None
    prompts: dict[str, str] = field(default_factory=dict)  # prompt name -> template
    default_input_type: str | None = None
    default_instruction: str | None = None  # what fills a template's {instruction} slot
    implementation: str = "auto"  # `loader.chosen_config` says what each value picks

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if self.implementation not in IMPLEMENTATIONS:
            raise InvalidOption(
                f"implementation {self.implementation!r} is not one of "
                + ", ".join(IMPLEMENTATIONS),
                param="implementation",
            )
        templates = [Template.parse(text, f"prompts.{name}") for name, text in self.prompts.items()]
        if self.default_input_type is not None and self.default_input_type not in self.prompts:
            raise InvalidOption(
                f"default_input_type {self.default_input_type!r} has no prompt template",
                param="default_input_type",
            )
        slotted = any(template.instructed for template in templates)
        if slotted and self.default_instruction is None:
            raise InvalidOption(
                "a prompt with an {instruction} slot needs a default_instruction, for requests "
                "that send none",
                param="default_instruction",
            )
        if self.default_instruction is not None:
            if not slotted:
                raise InvalidOption(
                    "default_instruction is set, but no prompt has an {instruction} slot",
                    param="default_instruction",
                )
            if len(self.default_instruction) > MAX_INSTRUCTION:
                raise InvalidOption(
                    f"default_instruction is over {MAX_INSTRUCTION} characters",
                    param="default_instruction",
                )
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise InvalidOption("max_seq_len must be at least 2", param="max_seq_len")
        if self.keep_alive_s is not None and not 0 <= self.keep_alive_s < math.inf:
            raise InvalidOption(
                f"keep_alive_s {self.keep_alive_s!r} must be a finite number of seconds, 0 or more",
                param="keep_alive_s",
            )

    def with_overrides(self, **changes: Any) -> ModelSpec:
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


BUILTIN = "builtin_models.toml"
# The keys of a models-file entry (ModelSpec's fields but its name) and what each must be:
# TOML gives any type, and a wrong one found only when a request needs it is a 500 on every
# request, not an error at start.
ENTRY_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "source": ((str,), "a string"),
    "revision": ((str,), "a string"),
    "pooling": ((str,), "a string"),
    "dtype": ((str,), "a string"),
    "max_seq_len": ((int,), "an integer"),
    "keep_alive_s": ((int, float), "a number of seconds"),
    "prompts": ((dict,), 'a table such as {query = "query: {text}"}'),
    "default_input_type": ((str,), "a string"),
    "default_instruction": ((str,), "a string"),
    "implementation": ((str,), "a string"),
}


def _entry(name: str, table: object, origin: str) -> ModelSpec:
    if not isinstance(table, dict):
        raise ConfigError(
            f"{origin}: models.{name} = {table!r} must be a table: [models.{name!r}] with "
            'source = "..." and its other keys'
        )
    unknown = set(table) - set(ENTRY_TYPES)
    if unknown:
        raise ConfigError(f"{origin}: model {name!r} has unknown keys {sorted(unknown)}")
    values = dict(table)
    if "source" not in values:
        raise ConfigError(f"{origin}: model {name!r} needs a source")
    for key, value in values.items():
        types, kind = ENTRY_TYPES[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise ConfigError(f"{origin}: model {name!r}: {key} = {value!r} must be {kind}")
    if not values["source"].strip():
        raise ConfigError(f"{origin}: model {name!r}: source is blank")
    for input_type, template in values.get("prompts", {}).items():
        if not isinstance(template, str):
            raise ConfigError(
                f"{origin}: model {name!r}: prompts.{input_type} = {template!r} must be a string"
            )
    try:
        if "pooling" in values:
            values["pooling"] = Pooling.parse(values["pooling"])
        return ModelSpec(name=name, **values)
    except (InvalidOption, TypeError) as exc:
        raise ConfigError(f"{origin}: model {name!r}: {exc}") from None


def load_catalog(models_file: Path | None) -> dict[str, ModelSpec]:
    """The built-in entries, overridden and extended by the operator's models file."""
    builtin = resources.files("embedx").joinpath(BUILTIN).read_text()
    tables: list[tuple[str, dict[str, Any]]] = [(BUILTIN, tomllib.loads(builtin))]
    if models_file is not None:
        if not models_file.is_file():
            raise ConfigError(f"EMBEDX_MODELS_FILE points to {models_file}, which is not a file")
        try:
            tables.append((str(models_file), tomllib.loads(models_file.read_text())))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{models_file} cannot be read: {exc}") from None
    catalog: dict[str, ModelSpec] = {}
    for origin, table in tables:
        extra = set(table) - {"models"}
        if extra:
            raise ConfigError(
                f"{origin}: unknown top-level keys {sorted(extra)}; use [models.NAME]"
            )
        models = table.get("models", {})
        if not isinstance(models, dict):
            raise ConfigError(f"{origin}: models = {models!r} must be tables: [models.NAME]")
        for name, entry in models.items():
            catalog[name] = _entry(name, entry, origin)
    return catalog
