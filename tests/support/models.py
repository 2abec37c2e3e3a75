"""The models tests run: the real MiniLM by name, tiny random models of every architecture
embedx has its own code for, tiny random cross-encoders, and a model that carries its own
Python; each built into a directory the caller gives."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# A tiny model of each architecture embedx runs on its own code, with each kind of pooling
# its code paths take: (shape, pooling).
NATIVE_POOLINGS = [("bert-base", "cls"), ("bert-base", "mean"), ("qwen3-0.6b", "last_token")]


def build_tiny_models(root: Path, tokenizer: Path) -> dict[str, Path]:
    """One tiny random model of each shape of embedx.models.random_init, by shape, with the
    tokenizer of the directory `tokenizer`."""
    from embedx.models.random_init import SHAPES, build

    models = {}
    for shape in SHAPES:
        build(shape, root / shape, tokenizer, tiny=True)
        models[shape] = root / shape
    return models


def build_tiny_classifiers(root: Path, tokenizer: Path, texts: list[str]) -> dict[str, Path]:
    """Tiny random cross-encoders, as transformers saves them: BERT with the WordPiece tokenizer
    of `tokenizer` and XLM-R with a sentencepiece (Unigram) one trained on `texts`, each with
    one label (a reranker) and three (a classifier): "bert-1", "bert-3", "xlm-roberta-1",
    "xlm-roberta-3"."""
    from embedx.models.random_init import build_classifier, build_unigram_tokenizer

    build_unigram_tokenizer(root / "unigram", texts)
    shapes = {"bert": ("bert-base", tokenizer),
              "xlm-roberta": ("xlm-roberta-large", root / "unigram")}  # fmt: skip
    models = {}
    for name, (shape, vocabulary) in shapes.items():
        for labels in (["relevance"], ["contradiction", "entailment", "neutral"]):
            directory = root / f"{name}-{len(labels)}"
            build_classifier(shape, directory, vocabulary, labels, tiny=True)
            models[f"{name}-{len(labels)}"] = directory
    return models


@dataclass(frozen=True)
class RemoteCodeModel:
    """A model directory whose config names its own Python (`auto_map`), which writes
    `marker` when imported: MiniLM's weights and slow tokenizer files, under a model_type
    that transformers has no code for."""

    directory: Path
    marker: Path


def build_remote_code_model(root: Path, minilm_dir: Path) -> RemoteCodeModel:
    directory = root / "remote-code"
    directory.mkdir()
    marker = root / "its-code-ran"
    for name in ("model.safetensors", "vocab.txt", "tokenizer_config.json",
                 "special_tokens_map.json"):  # fmt: skip
        (directory / name).write_bytes((minilm_dir / name).read_bytes())
    config = json.loads((minilm_dir / "config.json").read_text())
    config["model_type"] = "embedx-remote"
    config["auto_map"] = {"AutoConfig": "configuration_x.XConfig", "AutoModel": "modeling_x.XModel"}
    (directory / "config.json").write_text(json.dumps(config))
    runs = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
    (directory / "configuration_x.py").write_text(
        runs + "from transformers import BertConfig\n\n"
        "class XConfig(BertConfig):\n    model_type = 'embedx-remote'\n"
    )
    (directory / "modeling_x.py").write_text(
        runs + "from transformers import BertModel\nfrom .configuration_x import XConfig\n\n"
        "class XModel(BertModel):\n    config_class = XConfig\n"
    )
    return RemoteCodeModel(directory, marker)


# SPLADE's two SpladePooling settings beside its default: (pooling_strategy, activation_function)
SPLADE_POOLINGS = {"max-relu": ("max", "relu"), "sum-log1p_relu": ("sum", "log1p_relu")}


def build_tiny_splade(root: Path, texts: list[str]) -> dict[str, Path]:
    """A tiny random BERT masked LM with a sentencepiece (Unigram) tokenizer trained on
    `texts`, as transformers saves it ("mlm"), and saved by sentence-transformers as a
    SparseEncoder with each of `SPLADE_POOLINGS`, by its name."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    from embedx.models.random_init import build_masked_lm, build_unigram_tokenizer

    build_unigram_tokenizer(root / "unigram", texts)
    build_masked_lm("bert-base", root / "mlm", root / "unigram", tiny=True)
    models = {"mlm": root / "mlm"}
    for name, (strategy, activation) in SPLADE_POOLINGS.items():
        masked_lm = Transformer(str(root / "mlm"), transformer_task="fill-mask")
        pooling = SpladePooling(strategy, activation_function=activation)  # type: ignore[arg-type]
        SparseEncoder(modules=[masked_lm, pooling], device="cpu").save(str(root / name))
        models[name] = root / name
    return models


def build_sparser_splade(splade: Path, root: Path) -> Path:
    """A copy of a tiny SPLADE with its decoder's bias lowered: 10 to 140 weights a row of 801,
    as a trained SPLADE's are few."""
    import shutil

    from safetensors.torch import load_file, save_file

    directory = root / "splade"
    shutil.copytree(splade, directory)
    tensors = load_file(str(directory / "model.safetensors"))
    for name in ("cls.predictions.bias", "cls.predictions.decoder.bias"):
        if name in tensors:
            tensors[name] = tensors[name] - 0.4
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def build_tiny_m3(root: Path, texts: list[str]) -> Path:
    """A tiny random model of BGE-M3's shape (XLM-R, a sentencepiece tokenizer trained on
    `texts`) with random sparse_linear and colbert_linear heads, saved as FlagEmbedding saves
    one: transformers' files, and each head's state as a torch pickle (.pt) beside them."""
    import shutil

    import torch

    from embedx.models.random_init import build, build_unigram_tokenizer

    build_unigram_tokenizer(root / "unigram", texts)
    directory = root / "m3"
    build("xlm-roberta-large", directory, root / "unigram", tiny=True)
    for name in ("modules.json", "sentence_bert_config.json"):  # FlagEmbedding writes none
        (directory / name).unlink()
    shutil.rmtree(directory / "1_Pooling")
    hidden = json.loads((directory / "config.json").read_text())["hidden_size"]
    torch.manual_seed(0)
    for name, width in (("colbert_linear", hidden), ("sparse_linear", 1)):
        torch.save(torch.nn.Linear(hidden, width).state_dict(), directory / f"{name}.pt")
    return directory


def build_tiny_causal_reranker(root: Path, texts: list[str], max_length: int = 400) -> Path:
    """A tiny random Qwen3 causal LM saved as sentence-transformers saves a Qwen3-Reranker-style
    CrossEncoder (its Transformer and LogitScore modules), with a byte-level BPE tokenizer
    trained on `texts` ("yes" and "no" whole tokens) and Qwen3-Reranker's chat template; pairs
    cut at `max_length` tokens."""
    from sentence_transformers import CrossEncoder

    from embedx.models.random_init import build_causal_lm, build_chatml_tokenizer

    build_chatml_tokenizer(root / "chatml", texts)
    build_causal_lm("qwen3-0.6b", root / "causal-lm", root / "chatml", tiny=True)
    directory = root / "causal-reranker"
    CrossEncoder(str(root / "causal-lm"), device="cpu", max_length=max_length).save_pretrained(
        str(directory)
    )
    return directory
