"""A model name's face of an engine: the name's own spec and prompts over the engine's weights,
tokenizer and queue, which other names over the same weights share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from embedx.engine.texts import Prompts

if TYPE_CHECKING:
    from embedx.engine.engine import Engine
    from embedx.engine.options import EmbedOptions, EmbedResult, ScoreOptions, ScoreResult
    from embedx.models.catalog import ModelSpec
    from embedx.models.task import ModelTask
    from embedx.models.tokenizer import TextTokenizer


class NamedEngine:
    """What a request leases: `engine` run under the name of `spec`, with its prompts."""

    __slots__ = ("engine", "prompts", "spec")

    def __init__(self, spec: ModelSpec, engine: Engine) -> None:
        self.spec = spec
        self.engine = engine
        self.prompts = Prompts.of(spec, engine.files, engine.options.wrapping)

    @property
    def task(self) -> ModelTask:
        return self.engine.task

    @property
    def tokenizer(self) -> TextTokenizer:
        return self.engine.tokenizer

    async def embed(self, texts: Sequence[str], options: EmbedOptions | None = None) -> EmbedResult:
        return await self.engine.embed(texts, options, prompts=self.prompts)

    async def score(
        self, inputs: Sequence[str | tuple[str, str]], options: ScoreOptions | None = None
    ) -> ScoreResult:
        return await self.engine.score(inputs, options, name=self.spec.name)
