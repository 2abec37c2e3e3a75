"""Random-weight models of known architectures, built from a config with no download: what the
tests and benchmarks run where no real checkpoint of that shape ships offline."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Real models' shapes; the tests shrink them with `tiny=True`.
SHAPES: dict[str, dict[str, Any]] = {
    "bert-base": {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
                  "num_attention_heads": 12, "intermediate_size": 3072,
                  "max_position_embeddings": 512, "pooling": "cls"},
    "bert-large": {"model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24,
                   "num_attention_heads": 16, "intermediate_size": 4096,
                   "max_position_embeddings": 512, "pooling": "cls"},
    "xlm-roberta-large": {"model_type": "xlm-roberta", "hidden_size": 1024,
                          "num_hidden_layers": 24, "num_attention_heads": 16,
                          "intermediate_size": 4096, "max_position_embeddings": 514,
                          "vocab_size": 250002, "type_vocab_size": 1, "pad_token_id": 1,
                          "bos_token_id": 0, "eos_token_id": 2, "pooling": "mean"},
    "qwen3-0.6b": {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                   "intermediate_size": 3072, "max_position_embeddings": 40960,
                   "vocab_size": 151669, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                   "tie_word_embeddings": True, "pooling": "last_token"},
}  # fmt: skip
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128}  # fmt: skip
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
# A classifier's encoder and head, at 0.02 like the rest, would barely tell inputs apart.
CLASSIFIER_UNIT_SCALE = ("bert.encoder.", "roberta.encoder.", "bert.pooler.", "classifier.")
ST_POOLING_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                   "last_token": "pooling_mode_lasttoken"}  # fmt: skip


def build(
    shape: str,
    directory: Path,
    tokenizer_from: Path,
    *,
    tiny: bool = False,
    device: str = "cpu",
    seed: int = 0,
) -> str:
    """Write a random `shape` model (safetensors, float32) with the tokenizer of
    `tokenizer_from` and sentence-transformers configs into `directory`; returns its pooling."""
    from transformers import AutoModel

    spec = dict(SHAPES[shape])
    pooling: str = spec.pop("pooling")
    hidden = _save(AutoModel, spec, directory, tokenizer_from, tiny=tiny, device=device, seed=seed)
    _write_sentence_transformers_configs(directory, hidden, pooling)
    return pooling


def build_classifier(
    shape: str,
    directory: Path,
    tokenizer_from: Path,
    labels: Sequence[str],
    *,
    tiny: bool = False,
    device: str = "cpu",
    seed: int = 0,
) -> None:
    """Write a random `shape` *ForSequenceClassification model with `labels` (id2label), as
    transformers saves one, with the tokenizer of `tokenizer_from`, into `directory`. Its
    layers keep the activations' scale, so that its scores follow its inputs."""
    from transformers import AutoModelForSequenceClassification

    spec = {key: value for key, value in SHAPES[shape].items() if key != "pooling"}
    spec["id2label"] = dict(enumerate(labels))
    spec["label2id"] = {label: i for i, label in enumerate(labels)}
    auto = AutoModelForSequenceClassification
    _save(auto, spec, directory, tokenizer_from, tiny=tiny, device=device, seed=seed,
          unit_scale=CLASSIFIER_UNIT_SCALE)  # fmt: skip


def build_masked_lm(
    shape: str,
    directory: Path,
    tokenizer_from: Path,
    *,
    tiny: bool = False,
    device: str = "cpu",
    seed: int = 0,
) -> None:
    """Write a random `shape` *ForMaskedLM model (SPLADE's kind), as transformers saves one, with
    the tokenizer of `tokenizer_from`, into `directory`; its decoder tied to the word embeddings,
    as in real checkpoints."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForMaskedLM

    spec = {key: value for key, value in SHAPES[shape].items() if key != "pooling"}
    _save(AutoModelForMaskedLM, spec, directory, tokenizer_from, tiny=tiny, device=device,
          seed=seed)  # fmt: skip
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    for decoder, word in (("cls.predictions.decoder.weight", "bert."),
                          ("lm_head.decoder.weight", "roberta.")):  # fmt: skip
        if decoder in tensors:
            tensors[decoder] = tensors[word + "embeddings.word_embeddings.weight"].clone()
    save_file(tensors, str(path), metadata={"format": "pt"})


def _save(
    auto: Any,
    spec: dict[str, Any],
    directory: Path,
    tokenizer_from: Path,
    *,
    tiny: bool,
    device: str,
    seed: int,
    unit_scale: tuple[str, ...] = (),
) -> int:
    """The model `auto` builds from `spec`, random, saved with its config and tokenizer; returns
    its hidden size. Linear layers named under `unit_scale` keep their inputs' scale and get
    random biases."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    spec = dict(spec)
    model_type = spec.pop("model_type")
    # The borrowed tokenizer's ids must fit the table; larger real tables are kept for size.
    pieces = _vocab_size(tokenizer_from)
    if tiny:
        spec.update(TINY, vocab_size=pieces)
        if model_type == "qwen3":
            spec.update(num_key_value_heads=2, head_dim=16, max_position_embeddings=2048)
    spec["vocab_size"] = max(spec.get("vocab_size", pieces), pieces)
    config = AutoConfig.for_model(model_type, **spec)
    with torch.device("meta"):
        skeleton = auto.from_config(config)
    generator = torch.Generator(device=device).manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, meta in skeleton.state_dict().items():
        linear = name.startswith(unit_scale) and "LayerNorm" not in name
        if linear and name.endswith("weight"):
            tensor = torch.randn(meta.shape, device=device, generator=generator)
            tensor /= meta.shape[-1] ** 0.5
        elif linear:
            tensor = torch.randn(meta.shape, device=device, generator=generator) * 0.5
        elif name.endswith(("norm.weight", "LayerNorm.weight")):
            tensor = torch.ones(meta.shape, device=device)
        elif name.endswith("bias") or "position_ids" in name:
            tensor = torch.zeros(meta.shape, device=device, dtype=meta.dtype)
        else:
            tensor = torch.randn(meta.shape, device=device, generator=generator) * 0.02
        tensors[name] = tensor.contiguous().cpu()
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config_dict = config.to_dict()
    config_dict["architectures"] = [type(skeleton).__name__]
    config_dict["torch_dtype"] = "float32"
    (directory / "config.json").write_text(json.dumps(config_dict, indent=1))
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, directory / name)
    hidden: int = config.hidden_size
    return hidden


def _vocab_size(tokenizer_from: Path) -> int:
    """The ids a tokenizer emits: those of its tokenizer.json, else (BERT's vocab.txt) 30522."""
    path = tokenizer_from / "tokenizer.json"
    if not path.is_file():
        return 30522
    from tokenizers import Tokenizer

    vocab: int = Tokenizer.from_file(str(path)).get_vocab_size()
    return vocab


def build_unigram_tokenizer(directory: Path, texts: Sequence[str], vocab_size: int = 800) -> None:
    """Write an XLM-R style tokenizer (sentencepiece Unigram, trained on `texts`, with XLM-R's
    special tokens, ids and pair template) into `directory`, as transformers saves one."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from tokenizers.processors import TemplateProcessing

    tokenizer = Tokenizer(models.Unigram())
    # transformers' XLMRobertaTokenizer rebuilds exactly this pre-tokenizer and no normalizer
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(prepend_scheme="always")]
    )
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="always")
    specials = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0 to 3, as XLM-R's
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>"
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tokenizer.post_processor = TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    names = dict(zip(("bos_token", "pad_token", "eos_token", "unk_token"), specials, strict=True))
    settings = {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 512, **names,
                "cls_token": "<s>", "sep_token": "</s>", "mask_token": "<mask>"}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=1))


def _write_sentence_transformers_configs(directory: Path, hidden: int, pooling: str) -> None:
    """modules.json and the Pooling config, so sentence-transformers loads the same model."""
    kinds = ("Transformer", "Pooling")
    modules = [
        {"idx": i, "name": str(i), "path": ("", "1_Pooling")[i],
         "type": f"sentence_transformers.models.{kind}"}
        for i, kind in enumerate(kinds)
    ]  # fmt: skip
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    flags = {key: key == ST_POOLING_KEYS[pooling] for key in ST_POOLING_KEYS.values()}
    (directory / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": hidden, **flags})
    )
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 512, "do_lower_case": False})
    )


# Qwen3-Reranker's chat template, as sentence-transformers' tests give it: a pair's query and
# document by role, the instruction from a system message (else its own default), and the
# assistant turn the yes/no logits are read after.
RERANKER_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
    '<Instruct>: {{ messages | selectattr("role", "eq", "system") | map(attribute="content") '
    '| first | default("Given a web search query, retrieve relevant passages that answer the '
    'query") }}\n'
    '<Query>: {{ messages | selectattr("role", "eq", "query") | map(attribute="content") '
    "| first }}\n"
    '<Document>: {{ messages | selectattr("role", "eq", "document") | map(attribute="content") '
    "| first }}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n\n"
)  # Jinja drops the last newline: the assistant turn ends in "</think>\n\n", as Qwen's
# Qwen2's pre-tokenizer split, before the byte-level mapping
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build_chatml_tokenizer(directory: Path, texts: Sequence[str], vocab_size: int = 1000) -> None:
    """Write a Qwen-style tokenizer (byte-level BPE trained on `texts`, Qwen2's split, ChatML's
    special tokens, "yes" and "no" whole tokens) with the reranker's chat template into
    `directory`, as transformers saves one."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([*texts, *["yes", "no"] * 50], trainer)  # each a token
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in ("<think>", "</think>")])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    settings = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 131072,
                "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                "unk_token": None, "add_prefix_space": False}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=1))
    (directory / "chat_template.jinja").write_text(RERANKER_TEMPLATE)


def build_causal_lm(shape: str, directory: Path, tokenizer_from: Path, *, tiny: bool = False,
                    seed: int = 0) -> None:  # fmt: skip
    """Write a random `shape` *ForCausalLM (a Qwen3-Reranker's kind), as transformers saves one,
    with the tokenizer (and chat template) of `tokenizer_from`, into `directory`."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    spec = {key: value for key, value in SHAPES[shape].items() if key != "pooling"}
    _save(AutoModelForCausalLM, spec, directory, tokenizer_from, tiny=tiny, device="cpu",
          seed=seed)  # fmt: skip
    if spec.get("tie_word_embeddings"):  # the head is the word embeddings: saved once, as Qwen's
        path = directory / "model.safetensors"
        tensors = load_file(str(path))
        del tensors["lm_head.weight"]
        save_file(tensors, str(path), metadata={"format": "pt"})
    if (tokenizer_from / "chat_template.jinja").is_file():
        shutil.copy(tokenizer_from / "chat_template.jinja", directory / "chat_template.jinja")
