"""A request's texts (or pairs) checked, and texts wrapped in the prompt its input type names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedx.errors import EmptyInput, InvalidInput

if TYPE_CHECKING:
    from embedx.models.catalog import ModelSpec
    from embedx.models.source import ModelFiles


@dataclass(frozen=True, slots=True)
class Prompts:
    """A model's prompt templates by input type, the input type it defaults to, and the
    server-wide wrapping for texts that have neither."""

    model: str
    templates: dict[str, str]
    default: str | None
    wrapping: str | None

    @classmethod
    def of(cls, spec: ModelSpec, files: ModelFiles, wrapping: str | None) -> Prompts:
        """The catalog entry's prompts, else those of the model's sentence-transformers
        config, whose texts go before the input's, as sentence-transformers puts them."""
        if spec.prompts:
            return cls(spec.name, spec.prompts, spec.default_input_type, wrapping)
        templates = {name: text + "{text}" for name, text in files.st_prompts.items()}
        if "passage" not in templates and "document" in templates:  # Qwen3's, for one
            templates["passage"] = templates["document"]
        return cls(spec.name, templates, files.st_default_prompt, wrapping)

    def template_for(self, input_type: str | None) -> str | None:
        """The template a request's texts go through: the prompt for its input type (or the
        default one), else the wrapping."""
        chosen = input_type or self.default
        if chosen is None:
            return self.wrapping
        if chosen not in self.templates:
            known = ", ".join(sorted(self.templates)) or "none"
            raise InvalidInput(
                f"model {self.model!r} has no prompt for input_type {chosen!r} (it has: {known})",
                param="input_type",
            )
        return self.templates[chosen]

    def wrap(self, texts: Sequence[str], input_type: str | None) -> Sequence[str]:
        template = self.template_for(input_type)
        if template is None:
            return texts
        # at the last "{text}": a catalog's template or the wrapping holds one (checked at
        # start), a sentence-transformers prompt put before it may hold another
        before, _, after = template.rpartition("{text}")
        return [before + text + after for text in texts]


def plain_texts(texts: Sequence[object]) -> bool:
    """Whether every item is a non-empty str: the usual call, checked without a Python step
    a text (anything else takes the detailed checks, which name the item at fault)."""
    return set(map(type, texts)) == {str} and "" not in texts


def checked_texts(texts: Sequence[str]) -> Sequence[str]:
    """`texts`, each a non-empty string, as a list or tuple (sliced: a deque is not)."""
    if isinstance(texts, str | bytes) or not isinstance(texts, Sequence):
        raise InvalidInput(
            f"texts must be a list of strings, not {type(texts).__name__}", param="input"
        )
    if not texts:
        raise EmptyInput("texts is empty: send at least one text", param="input")
    if not plain_texts(texts):
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidInput(
                    f"input {i} is a {type(text).__name__}, not a string", param="input"
                )
            if not text:
                raise InvalidInput(f"input {i} is an empty string", param="input")
    return texts if isinstance(texts, list | tuple) else list(texts)


def checked_scored(inputs: object) -> list[str | tuple[str, str]]:
    """What a scorer is given: (query, document) pairs, or single texts (a classifier's), as a
    list of tuples and strings."""
    if isinstance(inputs, str | bytes) or not isinstance(inputs, Sequence):
        raise InvalidInput(
            f"pairs must be a list of (query, document) pairs or texts, not "
            f"{type(inputs).__name__}",
            param="input",
        )
    if not inputs:
        raise EmptyInput("nothing to score: send at least one pair or text", param="input")
    checked: list[str | tuple[str, str]] = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            checked.append(item)
        elif (
            isinstance(item, tuple | list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], str)
        ):
            checked.append((item[0], item[1]))
        else:
            raise InvalidInput(
                f"input {i} is neither a text nor a (query, document) of two strings",
                param="input",
            )
    return checked
