"""A request's texts (or pairs) checked, and texts wrapped in the prompt its input type names,
its instruction in the prompt's slot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedx.errors import EmptyInput, InvalidInput, InvalidOption
from embedx.models.prompts import (
    FAMILIES,
    INPUT_TYPES,
    INSTRUCTED_INPUT_TYPE,
    MAX_INSTRUCTION,
    Template,
)
from embedx.models.source import HUB_PREFIX
from embedx.untrusted import shown

if TYPE_CHECKING:
    from embedx.models.catalog import ModelSpec
    from embedx.models.source import ModelFiles


@dataclass(frozen=True, slots=True)
class Prompts:
    """A model's prompts by name, the one it defaults to, the instruction its slots take
    when a request sends none, and the server-wide wrapping for texts that have no prompt."""

    model: str
    templates: dict[str, Template]
    default: str | None
    default_instruction: str | None
    wrapping: Template | None

    @classmethod
    def of(cls, spec: ModelSpec, files: ModelFiles, wrapping: str | None) -> Prompts:
        """The catalog entry's prompts, else its instruct family's published ones (over its
        sentence-transformers config's, whose fixed instruction they replace), else those of
        the config, whose texts go before the input's, as sentence-transformers puts them."""
        plain = None if wrapping is None else Template.plain(wrapping)
        if spec.prompts:
            templates = {name: Template.parse(text, name) for name, text in spec.prompts.items()}
            return cls(spec.name, templates, spec.default_input_type, spec.default_instruction,
                       plain)  # fmt: skip
        templates = {name: Template.prefix(text) for name, text in files.st_prompts.items()}
        family = FAMILIES.get(spec.source.removeprefix(HUB_PREFIX))
        if family is None:
            return cls(spec.name, templates, files.st_default_prompt, None, plain)
        templates |= {name: Template.parse(text, name) for name, text in family.prompts.items()}
        default = files.st_default_prompt
        return cls(spec.name, templates, default, family.default_instruction, plain)

    @property
    def wraps(self) -> bool:
        """Whether some prompt or the wrapping may wrap the model's texts."""
        return bool(self.templates) or self.wrapping is not None

    def template_for(self, input_type: str | None, instruction: str | None) -> Template | None:
        """The template a request's texts go through: the model's prompt its input type takes
        (or the default one; with an instruction, the query side's), else the wrapping; its
        slot filled with the request's instruction, else the model's default one."""
        if instruction is not None:
            self._check_instruction(instruction)
        if input_type is not None and not isinstance(input_type, str):
            raise InvalidOption(
                f"input_type must be a string, not {type(input_type).__name__}",
                param="input_type",
            )
        chosen = input_type
        if chosen is None:
            chosen = INSTRUCTED_INPUT_TYPE if instruction is not None else self.default
        template = self.wrapping if chosen is None else self.templates[self._prompt(chosen)]
        if template is None or not template.instructed:
            if instruction is not None:
                raise InvalidOption(
                    f"model {self.model!r}'s prompt for input_type {chosen!r} has no "
                    "{instruction} slot: an instruction goes with queries (input_type query, "
                    "or none)",
                    param="instruction",
                )
            return template
        return template.fill(instruction if instruction is not None else self._default())

    def _prompt(self, input_type: str) -> str:
        """The model's prompt an input type takes (`INPUT_TYPES`), or its own of that name."""
        for name in INPUT_TYPES.get(input_type, (input_type,)):
            if name in self.templates:
                return name
        known = ", ".join(sorted(self.templates)) or "none"
        if input_type in INPUT_TYPES:
            raise InvalidInput(
                f"model {self.model!r} has no prompt for input_type {input_type!r} (its "
                f"prompts: {known})",
                param="input_type",
            )
        raise InvalidOption(
            f"input_type '{shown(input_type)}' is none of {', '.join(INPUT_TYPES)}, nor a "
            f"prompt of model {self.model!r} (its prompts: {known})",
            param="input_type",
        )

    def _default(self) -> str:
        assert self.default_instruction is not None, "a slot comes with a default (catalog.py)"
        return self.default_instruction

    def _check_instruction(self, instruction: object) -> None:
        """An instruction is a string within its bound, for a model with a slot for it."""
        if not any(template.instructed for template in self.templates.values()):
            raise InvalidOption(
                f"model {self.model!r} takes no instruction: none of its prompts has an "
                "{instruction} slot (a catalog entry's may: prompts.query = "
                '"Instruct: {instruction}\\nQuery: {text}")',
                param="instruction",
            )
        if not isinstance(instruction, str):
            raise InvalidOption(
                f"instruction must be a string, not {type(instruction).__name__}",
                param="instruction",
            )
        if len(instruction) > MAX_INSTRUCTION:
            raise InvalidOption(
                f"instruction is {len(instruction)} characters long; at most "
                f"{MAX_INSTRUCTION} are taken",
                param="instruction",
            )
        if not instruction.isascii():  # a lone surrogate would fail the tokenizer namelessly
            try:
                instruction.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidOption(
                    f"instruction is not valid Unicode: {exc.reason} at character {exc.start}",
                    param="instruction",
                ) from None

    def wrap(
        self, texts: Sequence[str], input_type: str | None, instruction: str | None = None
    ) -> Sequence[str]:
        template = self.template_for(input_type, instruction)
        if template is None:
            return texts
        return [template.before + text + template.after for text in texts]


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
