"""What a model is for, read once from its files: embedding texts (dense rows, and BGE-M3's sparse
and ColBERT rows where its heads lie beside it), sparse rows (SPLADE), or scoring (query,
document) pairs with which labels and which activation (as transformers and sentence-transformers'
CrossEncoder read them), and that activation applied to logits.

A model gives SPLADE's sparse rows when sentence-transformers saved it as a SparseEncoder
(config_sentence_transformers.json's model_type, its modules a Transformer (or MLMTransformer)
and SpladePooling, whose config says max or sum, relu or log1p_relu), or when its catalog entry
or first request states `pooling = "splade"` (then max and relu, SPLADE v2's); either way its
architecture must be a `*ForMaskedLM`.

A model scores pairs when its config's first architecture is a `*ForSequenceClassification`,
or when sentence-transformers saved it as a CrossEncoder of a `*ForCausalLM` and a LogitScore
module (Qwen3-Reranker's kind: the logit of its "yes" token less that of its "no" token after
the chat-template render of the pair, one label); any other architecture embeds (a causal LM
with no such files among them). A classifier's labels are transformers' reading of the
config: `id2label` in id order, else `num_labels` (2 if unset) labels named LABEL_i.

The activation follows sentence-transformers' CrossEncoder (6.2), which takes the first of:
  1. a saved CrossEncoder's `activation_fn` in config_sentence_transformers.json (read where
     sentence-transformers reads it: modules.json is there and that file's model_type is
     CrossEncoder; sentence-transformers 6 saves this);
  2. config.json's `sentence_transformers.activation_fn` (sentence-transformers 4 and 5);
  3. config.json's `sbert_ce_default_activation_function` (before 4);
  4. Sigmoid for one label, Identity for several.
Each names a torch.nn class by its dotted path. embedx maps it to the scores it returns:
  Sigmoid                  -> "sigmoid":  the sigmoid of each logit, as `predict()` gives;
  Identity, one label      -> "identity": the logit itself, as `predict()` gives;
  Identity, several labels -> "softmax":  softmax over the labels, as
                              `predict(apply_softmax=True)` gives (`predict()` gives the logits,
                              which embedx's raw scores are);
  Softmax                  -> "softmax":  as `predict()` gives (nn.Softmax() takes dim 1 of the
                              (B, labels) logits).
Any other class is refused, and so is a path outside torch: sentence-transformers skips such a
path (it would run code from the config under trust_remote_code) and takes the next rule, but
embedx runs no code named by a config, and a score unlike the model's own is worse than none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeGuard

import numpy as np

from embedx.errors import InvalidModel, InvalidOption

Kind = Literal["embed", "score", "sparse"]
Activation = Literal["sigmoid", "softmax", "identity"]

# torch.nn classes by the module paths sentence-transformers saves them under (`fullname`) or
# a user may write (torch.nn.Sigmoid)
TORCH_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity", "Softmax": "softmax"}
TORCH_MODULES = ("torch.nn", "torch.nn.modules.activation", "torch.nn.modules.linear")
CROSS_ENCODER = "CrossEncoder"  # config_sentence_transformers.json's model_type for one
SPARSE_ENCODER = "SparseEncoder"
DENSE = ("dense",)
SPARSE = ("sparse",)


@dataclass(frozen=True, slots=True)
class Splade:
    """sentence-transformers' SpladePooling: the max (or sum) over a text's tokens of
    log(1 + relu(logit)), with activation log1p_relu log'd once more."""

    strategy: str = "max"
    twice: bool = False


@dataclass(frozen=True, slots=True)
class LogitScore:
    """sentence-transformers' LogitScore: a causal LM's last-token logit of `true_id`, less that
    of `false_id` where it has one."""

    true_id: int
    false_id: int | None


@dataclass(frozen=True, slots=True)
class ModelTask:
    """What a model is for. A scoring model has one label per logit, in logit order."""

    kind: Kind
    labels: tuple[str, ...] = ()
    activation: Activation = "identity"  # from logits to the scores a request gets
    outputs: tuple[str, ...] = DENSE  # what rows an embedder gives: dense, sparse, colbert
    splade: Splade | None = None  # a sparse model's pooling
    unweighted: tuple[int, ...] = ()  # token ids BGE-M3's sparse rows leave out
    logit_score: LogitScore | None = None  # a causal-LM reranker's yes/no tokens


EMBEDDING = ModelTask("embed")


def task_of(config: dict[str, Any], directory: Path) -> ModelTask:
    """The model's task, from its config.json (`config`) and the sentence-transformers files in
    `directory`. InvalidModel where the files contradict each other or name what embedx will
    not run."""
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise InvalidModel(f"config.json: architectures {architectures!r} is not a list of names")
    splade = saved_sparse_encoder(directory)
    if splade is not None:
        _masked_lm(architectures, "a sentence-transformers SparseEncoder")
        return ModelTask("sparse", outputs=SPARSE, splade=splade)
    saved = saved_cross_encoder(directory)
    logit_score = saved_logit_score(directory) if saved is not None else None
    if logit_score is not None:
        if not architectures or not architectures[0].endswith("ForCausalLM"):
            raise InvalidModel(
                f"a CrossEncoder's LogitScore module reads a causal LM's logits; this model's "
                f"architecture is {architectures[0] if architectures else 'none'}"
            )
    elif not architectures or not architectures[0].endswith("ForSequenceClassification"):
        declared = saved is not None or _config_activation(config) is not None
        if declared:  # a CrossEncoder of another kind (a causal LM's yes/no logits, say)
            architecture = architectures[0] if architectures else "none"
            raise InvalidModel(
                f"the model is a sentence-transformers CrossEncoder of architecture "
                f"{architecture}: embedx scores pairs with *ForSequenceClassification models, "
                "and causal LMs saved with a LogitScore module"
            )
        from embedx.models.m3 import found_heads  # BGE-M3's heads beside its weights

        heads = found_heads(directory)
        if heads is None:
            return EMBEDDING
        return ModelTask("embed", outputs=heads.outputs, unweighted=heads.unweighted)
    labels = ("LABEL_0",) if logit_score is not None else _labels(config)  # ST: num_labels 1
    path = saved.get("activation_fn") if saved is not None else None
    if path is None:
        path = _config_activation(config)
    if path is None:
        activation: Activation = "sigmoid" if len(labels) == 1 else "softmax"
    else:
        activation = _activation(path)
        if activation == "identity" and len(labels) > 1:
            activation = "softmax"
    return ModelTask("score", labels, activation, logit_score=logit_score)


def saved_cross_encoder(directory: Path) -> dict[str, Any] | None:
    """config_sentence_transformers.json where sentence-transformers' CrossEncoder reads it (a
    model it saved: modules.json beside it, model_type CrossEncoder), else None. Such a model's
    modules must be the one Transformer: anything after it would change the scores."""
    saved = _saved_modules(directory, CROSS_ENCODER)
    if saved is None:
        return None
    settings, _, kinds = saved
    if kinds not in (["Transformer"], ["Transformer", "LogitScore"]):
        raise InvalidModel(
            f"{directory / 'modules.json'}: a CrossEncoder of modules {kinds}: embedx runs a "
            "single Transformer module (the sequence-classification model itself), or a causal "
            "LM's Transformer and LogitScore"
        )
    return settings


def _saved_modules(
    directory: Path, model_type: str
) -> tuple[dict[str, Any], list[Any], list[Any]] | None:
    """What sentence-transformers saved of a model of `model_type` (its
    config_sentence_transformers.json and modules.json beside it): the settings, the modules
    listed, and each one's kind (its class's name); None for a model it did not save so."""
    modules_path = directory / "modules.json"
    settings_path = directory / "config_sentence_transformers.json"
    if not modules_path.is_file() or not settings_path.is_file():
        return None
    settings = read_json(settings_path)
    if not isinstance(settings, dict) or settings.get("model_type") != model_type:
        return None
    modules = read_json(modules_path)
    listed = modules if isinstance(modules, list) else [modules]
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] if isinstance(m, dict) else m
             for m in listed]  # fmt: skip
    return settings, listed, kinds


def saved_logit_score(directory: Path) -> LogitScore | None:
    """The LogitScore module of a saved CrossEncoder (`saved_cross_encoder`'s modules), if it
    has one: its token ids, as its config.json states them."""
    listed = read_json(directory / "modules.json")
    listed = listed if isinstance(listed, list) else [listed]
    if len(listed) != 2:
        return None
    path = directory / str(listed[1].get("path", "")) / "config.json"
    module = read_json(path)
    module = module if isinstance(module, dict) else {}
    true_id, false_id = module.get("true_token_id"), module.get("false_token_id")
    if not _token_id(true_id) or (false_id is not None and not _token_id(false_id)):
        raise InvalidModel(f"{path}: true_token_id {true_id!r} and false_token_id {false_id!r} "
                           "are not token ids")  # fmt: skip
    reads = module.get("module_input_name", "causal_logits")
    if reads != "causal_logits":
        raise InvalidModel(f"{path}: a LogitScore that reads {reads!r}, not the causal logits")
    return LogitScore(true_id, false_id)


def _token_id(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def saved_sparse_encoder(directory: Path) -> Splade | None:
    """The SpladePooling of a model sentence-transformers saved as a SparseEncoder, else None.
    Its modules must be the masked LM and SpladePooling: anything else changes the rows."""
    saved = _saved_modules(directory, SPARSE_ENCODER)
    if saved is None:
        return None
    _, listed, kinds = saved
    if kinds not in (["Transformer", "SpladePooling"], ["MLMTransformer", "SpladePooling"]):
        raise InvalidModel(
            f"{directory / 'modules.json'}: a SparseEncoder of modules {kinds}: embedx runs "
            "only a masked LM (Transformer or MLMTransformer) and SpladePooling"
        )
    pooling = read_json(directory / str(listed[1].get("path", "")) / "config.json")
    strategy = pooling.get("pooling_strategy", "max") if isinstance(pooling, dict) else None
    activation = pooling.get("activation_function", "relu") if isinstance(pooling, dict) else None
    if strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise InvalidModel(
            f"SpladePooling of pooling_strategy {strategy!r} and activation_function "
            f"{activation!r}: embedx runs max or sum, relu or log1p_relu"
        )
    return Splade(strategy, twice=activation == "log1p_relu")


def with_pooling(task: ModelTask, config: dict[str, Any], pooling: str | None) -> ModelTask:
    """The task once the pooling a catalog entry or request states is known: `splade` makes a
    masked LM a sparse model; any other pooling of a sparse model is a contradiction."""
    if task.kind == "sparse":
        if pooling not in (None, "splade"):
            raise InvalidOption(
                f"the model is a SPLADE sparse encoder (its files say so): pooling {pooling!r} "
                "does not apply to it; state splade or nothing",
                param="pooling",
            )
        return task
    if pooling != "splade" or task.kind == "score":
        return task
    _masked_lm(config.get("architectures") or [], "pooling splade")
    return ModelTask("sparse", outputs=SPARSE, splade=Splade())


def _masked_lm(architectures: list[str], what: str) -> None:
    if not architectures or not architectures[0].endswith("ForMaskedLM"):
        found = architectures[0] if architectures else "none"
        raise InvalidModel(
            f"{what} needs a masked LM (an architecture *ForMaskedLM); this model's is {found}"
        )


def _config_activation(config: dict[str, Any]) -> str | None:
    """The activation config.json names (sentence-transformers 4 and 5, or older), if any."""
    st = config.get("sentence_transformers")
    if isinstance(st, dict) and "activation_fn" in st:
        path: str | None = st["activation_fn"]
        return path
    old: str | None = config.get("sbert_ce_default_activation_function")
    return old


def _activation(path: object) -> Activation:
    if not isinstance(path, str):
        raise InvalidModel(f"activation_fn {path!r} is not a class path")
    module, _, name = path.rpartition(".")
    if not module.startswith("torch."):
        raise InvalidModel(
            f"activation_fn {path!r} is not a torch class: embedx runs no code named by a "
            "model's config"
        )
    if module not in TORCH_MODULES or name not in TORCH_ACTIVATIONS:
        raise InvalidModel(
            f"activation_fn {path!r} is not supported: embedx applies "
            + ", ".join(f"torch.nn.{n}" for n in TORCH_ACTIVATIONS)
        )
    activation: Activation = TORCH_ACTIVATIONS[name]  # type: ignore[assignment]
    return activation


def _labels(config: dict[str, Any]) -> tuple[str, ...]:
    """transformers' labels: id2label, in id order, else num_labels of them named LABEL_i."""
    id2label = config.get("id2label")
    if id2label is None:
        count = config.get("num_labels", 2)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidModel(f"config.json: num_labels {count!r} is not a positive integer")
        return tuple(f"LABEL_{i}" for i in range(count))
    if not isinstance(id2label, dict) or not id2label:
        raise InvalidModel(f"config.json: id2label {id2label!r} is not a map of labels")
    try:
        by_id = {int(key): str(label) for key, label in id2label.items()}
    except ValueError:
        raise InvalidModel(f"config.json: id2label keys {list(id2label)} are not ids") from None
    if sorted(by_id) != list(range(len(by_id))):
        raise InvalidModel(f"config.json: id2label ids {sorted(by_id)} are not 0 to n - 1")
    return tuple(by_id[i] for i in range(len(by_id)))


def activate(logits: np.ndarray, activation: Activation) -> np.ndarray:
    """Scores from (B, labels) float32 logits, as `ModelTask.activation` says."""
    if activation == "identity":
        return logits
    if activation == "sigmoid":
        with np.errstate(over="ignore"):  # exp(-logit) of a very negative logit: inf, score 0
            result: np.ndarray = 1.0 / (1.0 + np.exp(-logits))
        return result
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    softmax: np.ndarray = shifted / shifted.sum(axis=1, keepdims=True)
    return softmax


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidModel(f"{path} cannot be read: {exc}", param="model") from None
