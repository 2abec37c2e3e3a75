"""What a prompt is: the input types a request may name and the prompts each takes (one
table), a template's text around its input and its instruction, and the instruct families'
published templates."""

from __future__ import annotations

from dataclasses import dataclass

from embedx.errors import InvalidOption

TEXT = "{text}"
INSTRUCTION = "{instruction}"
MAX_INSTRUCTION = 4096  # characters: a task description is a sentence or two, never a document
# The input types a request may name, and the model's prompts each takes, the first it has:
# its own name first, so a prompt of the model's sentence-transformers config (as TEI's
# `prompt_name` names one) is taken as it is. Any other prompt name of the model's is taken
# too; anything else is refused, naming these.
INPUT_TYPES: dict[str, tuple[str, ...]] = {
    "query": ("query", "search_query"),
    "passage": ("passage", "document", "search_document"),
    "document": ("document", "passage", "search_document"),  # Voyage's; Qwen3's config's
    "search_query": ("search_query", "query"),  # Cohere's
    "search_document": ("search_document", "document", "passage"),  # Cohere's
    # Cohere's: e5's card embeds texts to classify or cluster as queries, and an instruct
    # model's task goes on the query side
    "classification": ("classification", "query"),
    "clustering": ("clustering", "query"),
}
# The query side: where a request's instruction goes when it names no input type
INSTRUCTED_INPUT_TYPE = "query"


@dataclass(frozen=True, slots=True)
class Template:
    """A prompt: the text before an input and after it; with a slot, the text before is
    split where the instruction goes (`before` + instruction + `between` + input)."""

    before: str
    after: str
    between: str | None = None  # None: no instruction slot

    @classmethod
    def parse(cls, template: str, param: str) -> Template:
        """A catalog's template: `{text}` once, and `{instruction}` at most once, before it."""
        if template.count(TEXT) != 1:
            raise InvalidOption(f"{param} must contain {TEXT} exactly once", param=param)
        before, _, after = template.partition(TEXT)
        if INSTRUCTION in after or before.count(INSTRUCTION) > 1:
            raise InvalidOption(
                f"{param} may contain {INSTRUCTION} once, before {TEXT}", param=param
            )
        if INSTRUCTION not in before:
            return cls(before, after)
        head, _, between = before.partition(INSTRUCTION)
        return cls(head, after, between)

    @classmethod
    def prefix(cls, text: str) -> Template:
        """A sentence-transformers prompt: its text goes before the input's as it is, braces
        included."""
        return cls(text, "")

    @classmethod
    def plain(cls, template: str) -> Template:
        """The server-wide wrapping: the text around its `{text}`, any other braces as they
        are."""
        before, _, after = template.rpartition(TEXT)
        return cls(before, after)

    @property
    def instructed(self) -> bool:
        return self.between is not None

    def fill(self, instruction: str) -> Template:
        """The template with its slot filled: a plain one."""
        assert self.between is not None, "fill() is for a template with a slot"
        return Template(self.before + instruction + self.between, self.after)


@dataclass(frozen=True, slots=True)
class InstructFamily:
    """An instruct family's published prompts and the instruction its card uses for
    retrieval."""

    prompts: dict[str, str]
    default_instruction: str


E5_INSTRUCT = InstructFamily(  # "Instruct: {task_description}\nQuery: {query}"; passages bare
    {"query": "Instruct: {instruction}\nQuery: {text}", "passage": "{text}"},
    "Given a web search query, retrieve relevant passages that answer the query",
)
QWEN3 = InstructFamily(  # as E5_INSTRUCT, with no space after "Query:", as its card writes it
    {"query": "Instruct: {instruction}\nQuery:{text}", "document": "{text}"},
    E5_INSTRUCT.default_instruction,
)
BGE_ICL = InstructFamily(  # zero-shot: FlagEmbedding's ICL query with its `\n<response>` suffix
    {"query": "<instruct>{instruction}\n<query>{text}\n<response>", "passage": "{text}"},
    "Given a web search query, retrieve relevant passages that answer the query.",
)
# By Hugging Face repo id: a model loaded from one (by its id, or a catalog entry whose
# source it is) takes its family's prompts unless its catalog entry states its own.
FAMILIES: dict[str, InstructFamily] = {
    "intfloat/multilingual-e5-large-instruct": E5_INSTRUCT,
    "intfloat/e5-mistral-7b-instruct": E5_INSTRUCT,
    "Alibaba-NLP/gte-Qwen2-1.5B-instruct": E5_INSTRUCT,
    "Alibaba-NLP/gte-Qwen2-7B-instruct": E5_INSTRUCT,
    "Qwen/Qwen3-Embedding-0.6B": QWEN3,
    "Qwen/Qwen3-Embedding-4B": QWEN3,
    "Qwen/Qwen3-Embedding-8B": QWEN3,
    "BAAI/bge-en-icl": BGE_ICL,
}
