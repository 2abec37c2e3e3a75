"""A causal-LM reranker's pairs as sentence-transformers' CrossEncoder (6.2) makes them: each
(query, document) rendered through the model's chat template, tokenized, cut to the model's
length, and the template's tail (its assistant turn) written back over a cut pair's last tokens.

CrossEncoder turns a pair into the messages [{role: query}, {role: document}], after a system
message holding the prompt where it has one (a caller's `prompt`, else the one its config's
default_prompt_name names; an empty prompt is none), renders them with the chat template
(`apply_chat_template`, the tokenizer's special tokens as its variables), tokenizes the text
without adding special tokens, truncated to the tokenizer's model_max_length on the right,
and, for every row that reached that length, overwrites its last tokens with the template's
suffix: the longest common tail of the token ids of two renders whose query and document
are "0" and "1 2 3 4" (`_restore_chat_template_suffix`).

embedx renders each template once, at load, with markers in the query, document and system
contents, and then builds each pair's text by joining the pieces between them. That is the
template's render only where it puts each content verbatim, once, and renders the same
around any content: checked at load on probe contents, and a template that does otherwise
(that changes a content, or branches on it) is refused rather than rendered differently. So
is a suffix that depends on the system message (a template that writes it after the document).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from embedx.errors import InvalidInput, InvalidModel, InvalidOption
from embedx.models.prompts import MAX_INSTRUCTION
from embedx.models.task import read_json
from embedx.models.tokenizer import Encoded, Input, TextTokenizer

if TYPE_CHECKING:
    from collections.abc import Callable

    from embedx.models.source import ModelFiles

# Content markers no template changes (private-use characters), and probes to check that it
# places contents verbatim: edges of whitespace, Jinja's own syntax, a newline
MARKERS = {"system": "\ue000S\ue001", "query": "\ue000Q\ue001", "document": "\ue000D\ue001"}
PROBES = ({"system": " a\n", "query": "{{ x }} ", "document": "\n\nb  "},
          {"system": "0", "query": "1 2 3 4", "document": "%}"})  # fmt: skip
SUFFIX_FILLERS = ("0", "1 2 3 4")  # sentence-transformers' two renders for the suffix
# sentence-transformers' InputFormatter: a template that reads these takes structured content
STRUCTURED = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")
FLAT_MODEL_TYPES = ("apertus", "deepseek_v3", "gpt_oss", "seed_oss")


@dataclass(frozen=True, slots=True)
class PairTemplate:
    """A render's text around a pair: `before` + query + `between` + document + `after`."""

    before: str
    between: str
    after: str

    def text(self, query: str, document: str) -> str:
        return self.before + query + self.between + document + self.after


class ChatPairs:
    """The model's chat template for pairs: without a system message, and (where the template
    reads one) with an instruction in it; the default instruction; the suffix a cut pair ends
    in."""

    def __init__(self, files: ModelFiles, encode: Callable[[str], list[int]]) -> None:
        render = _Renderer(files)
        structured = _message_format(files, render.template)

        def rendered(contents: dict[str, str]) -> str:
            roles = [r for r in ("system", "query", "document") if r in contents]
            return render([{"role": role, "content": [{"type": "text", "text": contents[role]}]
                            if structured else contents[role]} for role in roles])  # fmt: skip

        self.plain = _template(rendered, system=False)
        instructed = _template(rendered, system=True) if self._reads_system(rendered) else None
        self.instructed = instructed  # `before`/`between` hold the system marker
        self.default_instruction = files.st_prompts.get(files.st_default_prompt or "") or None
        suffixes = {tuple(_suffix(t, encode)) for t in self._fills(("", "0", "1 2 3 4"))}
        if len(suffixes) != 1:
            raise InvalidModel(
                "the chat template writes the system message after the document: its tail, "
                "which a cut pair keeps, would change with the instruction; embedx does not "
                "render such a template",
                param="model",
            )
        self.suffix = np.array(suffixes.pop(), dtype=np.int32)

    @staticmethod
    def _reads_system(rendered: Callable[[dict[str, str]], str]) -> bool:
        marked = rendered({"system": MARKERS["system"], "query": "q", "document": "d"})
        return MARKERS["system"] in marked

    def _fills(self, instructions: Sequence[str]) -> list[PairTemplate]:
        return [self.template(i) for i in instructions]

    def template(self, instruction: str | None) -> PairTemplate:
        """The pair template for a request's instruction (None: the default; empty: none, so
        the template's own), its system message filled."""
        chosen = self.default_instruction if instruction is None else instruction
        if not chosen or self.instructed is None:
            return self.plain
        marker, t = MARKERS["system"], self.instructed
        return PairTemplate(t.before.replace(marker, chosen), t.between.replace(marker, chosen),
                            t.after)  # fmt: skip

    def render(self, inputs: Sequence[str | tuple[str, str]], instruction: str | None) -> list[str]:
        """Each pair's rendered text, with `instruction` in the system message."""
        if instruction is not None:
            self._check_instruction(instruction)
        template = self.template(instruction)
        texts = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                raise InvalidInput(
                    f"input {i} is a single text: this model scores (query, document) pairs",
                    param="input",
                )
            texts.append(template.text(*item))
        return texts

    def _check_instruction(self, instruction: object) -> None:
        if self.instructed is None:
            raise InvalidOption(
                "this model takes no instruction: its chat template reads no system message",
                param="instruction",
            )
        if not isinstance(instruction, str):
            raise InvalidOption(f"instruction must be a string, not {type(instruction).__name__}",
                                param="instruction")  # fmt: skip
        if len(instruction) > MAX_INSTRUCTION:
            raise InvalidOption(f"instruction is {len(instruction)} characters long; at most "
                                f"{MAX_INSTRUCTION} are taken", param="instruction")  # fmt: skip
        try:
            instruction.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidOption(f"instruction is not valid Unicode: {exc.reason} at character "
                                f"{exc.start}", param="instruction") from None  # fmt: skip


class ChatPairTokenizer(TextTokenizer):
    """The model's tokenizer over rendered pairs (texts to it): truncated to `max_seq_len` on
    the right, and every row of that length ending in the template's suffix."""

    def __init__(self, files: ModelFiles, max_seq_len: int) -> None:
        super().__init__(files, max_seq_len)
        if self._tokenizer.num_special_tokens_to_add(False):
            raise InvalidModel(
                "the model's tokenizer adds special tokens to a text, which a chat template's "
                "render does not get: embedx cannot tokenize its pairs as sentence-transformers "
                "does",
                param="model",
            )
        from tokenizers import Tokenizer

        whole = Tokenizer.from_str(self._tokenizer.to_str())  # a copy, for the suffix's renders
        whole.no_truncation()
        self.chat = ChatPairs(files, lambda text: whole.encode(text, add_special_tokens=False).ids)

    def _gather(
        self, encodings: list[Any], truncate: bool, offset: int, unread: Sequence[int] = ()
    ) -> Encoded:
        encoded = super()._gather(encodings, truncate, offset, unread)
        restore_suffix(encoded, self.chat.suffix, self.max_seq_len)
        return encoded


def restore_suffix(encoded: Encoded, suffix: np.ndarray, length: int) -> None:
    """Write `suffix` over the last tokens of each row of `length` tokens, in place."""
    for offset, n in zip(encoded.offsets, encoded.lengths, strict=True):
        keep = min(len(suffix), n)
        if n >= length and keep:
            encoded.ids[offset + n - keep : offset + n] = suffix[len(suffix) - keep :]


def scored_inputs(
    tokenizer: TextTokenizer, inputs: list[str | tuple[str, str]], instruction: str | None
) -> Sequence[Input]:
    """What a scorer's tokenizer is given for a request: a causal-LM reranker's pairs rendered
    with the request's instruction; anyone else's inputs as they are (and no instruction)."""
    if isinstance(tokenizer, ChatPairTokenizer):
        return tokenizer.chat.render(inputs, instruction)
    if instruction is not None:
        raise InvalidOption(
            "this model takes no instruction: only a causal-LM reranker (a chat template's "
            "system message) does",
            param="instruction",
        )
    return inputs


def _message_format(files: ModelFiles, template: str) -> bool:
    """Whether the pair's messages carry structured content, as the saved Transformer module
    states (else as sentence-transformers infers it from the template); refuses a module that
    does not render pairs as messages."""
    path = files.directory / "sentence_bert_config.json"
    module = read_json(path) if path.is_file() else {}
    if not isinstance(module, dict) or module.get("transformer_task") != "text-generation":
        raise InvalidModel(f"{path}: a LogitScore CrossEncoder's Transformer module must be of "
                           "transformer_task text-generation", param="model")  # fmt: skip
    if module.get("processing_kwargs"):
        raise InvalidModel(f"{path}: processing_kwargs change how pairs are rendered or cut, "
                           "which embedx does not follow", param="model")  # fmt: skip
    modalities = module.get("modality_config") or {}
    message = modalities.get("message", {}) if isinstance(modalities, dict) else {}
    stated = message.get("format", "auto") if isinstance(message, dict) else None
    if stated in ("flat", "structured"):
        return bool(stated == "structured")
    if files.config.get("model_type") in FLAT_MODEL_TYPES:
        return False
    return any(pattern in template for pattern in STRUCTURED)


class _Renderer:
    """The model's chat template (`template`) as transformers renders it, the tokenizer's
    special tokens among its variables."""

    def __init__(self, files: ModelFiles) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(
            str(files.directory), local_files_only=True, trust_remote_code=False
        )
        template = getattr(self.tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            raise InvalidModel(
                "a causal-LM CrossEncoder needs a chat template that renders a (query, "
                "document) pair; this model's tokenizer has none (chat_template.jinja)",
                param="model",
            )
        self.template = template

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False))


def _template(rendered: Callable[[dict[str, str]], str], *, system: bool) -> PairTemplate:
    """The render of marked contents cut at the query's and document's markers, checked on the
    probes to place them verbatim and nothing else differently."""
    roles = ("system", "query", "document") if system else ("query", "document")
    text = rendered({role: MARKERS[role] for role in roles})
    query, document = MARKERS["query"], MARKERS["document"]
    once = text.count(query) == 1 and text.count(document) == 1
    if not once or text.find(query) > text.find(document):
        raise InvalidModel(
            "the chat template does not render a pair's query once, then its document: "
            "sentence-transformers' query and document roles do not reach it as they should",
            param="model",
        )
    before, _, rest = text.partition(query)
    between, _, after = rest.partition(document)
    template = PairTemplate(before, between, after)
    for probe in PROBES:
        got = rendered({role: probe[role] for role in roles})
        marker, content = MARKERS["system"], probe["system"]
        expected = PairTemplate(before.replace(marker, content), between.replace(marker, content),
                                after)  # fmt: skip
        if got != expected.text(probe["query"], probe["document"]) or marker in after:
            raise InvalidModel(
                "the chat template changes or branches on a pair's contents: embedx renders "
                "only a template that puts them in verbatim",
                param="model",
            )
    return template


def _suffix(template: PairTemplate, encode: Callable[[str], list[int]]) -> list[int]:
    """sentence-transformers' suffix: the longest common tail of two renders' token ids, where
    they differ somewhere (else none)."""
    first, second = (encode(template.text(f, f)) for f in SUFFIX_FILLERS)
    count = 0
    for left, right in zip(reversed(first), reversed(second), strict=False):
        if left != right:
            break
        count += 1
    if 0 < count < min(len(first), len(second)):
        return first[len(first) - count :]
    return []
