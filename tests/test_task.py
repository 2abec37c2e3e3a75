from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embedx.errors import InvalidModel
from embedx.models.task import EMBEDDING, ModelTask, activate, task_of


def config_of(directory: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((directory / "config.json").read_text())
    return config


def copy_of(directory: Path, tmp_path: Path, **changes: Any) -> Path:
    """The model in a directory of its own, its config.json changed (None deletes a key)."""
    target = tmp_path / directory.name
    shutil.copytree(directory, target)
    config = config_of(target)
    config.update(changes)
    config = {key: value for key, value in config.items() if value is not None}
    (target / "config.json").write_text(json.dumps(config))
    return target


def cross_encoder_activation(directory: Path) -> str:
    """The activation sentence-transformers' CrossEncoder resolves for the model, by class."""
    from sentence_transformers import CrossEncoder

    return type(CrossEncoder(str(directory), device="cpu").activation_fn).__name__


def test_an_embedding_model_is_for_embedding(minilm_dir: Path) -> None:
    assert task_of(config_of(minilm_dir), minilm_dir) == EMBEDDING


def test_a_config_without_architectures_embeds(minilm_dir: Path) -> None:
    config = {**config_of(minilm_dir), "architectures": None}
    assert task_of(config, minilm_dir).kind == "embed"


def test_a_reranker_scores_with_a_sigmoid_and_a_classifier_with_a_softmax(
    tiny_classifiers: dict[str, Path],
) -> None:
    reranker = tiny_classifiers["bert-1"]
    assert task_of(config_of(reranker), reranker) == ModelTask("score", ("relevance",), "sigmoid")
    assert cross_encoder_activation(reranker) == "Sigmoid"
    classifier = tiny_classifiers["xlm-roberta-3"]
    labels = ("contradiction", "entailment", "neutral")
    assert task_of(config_of(classifier), classifier) == ModelTask("score", labels, "softmax")
    # predict() gives the logits, predict(apply_softmax=True) the softmax embedx returns
    assert cross_encoder_activation(classifier) == "Identity"


@pytest.mark.parametrize(
    ("labels", "saved", "activation"),
    [
        ("bert-1", torch.nn.Identity(), "identity"),
        ("bert-3", torch.nn.Sigmoid(), "sigmoid"),
        ("bert-3", torch.nn.Identity(), "softmax"),
        ("bert-1", torch.nn.Sigmoid(), "sigmoid"),
    ],
)
def test_a_saved_cross_encoders_activation_is_the_one_it_applies(
    tiny_classifiers: dict[str, Path],
    tmp_path: Path,
    labels: str,
    saved: torch.nn.Module,
    activation: str,
) -> None:
    from sentence_transformers import CrossEncoder

    directory = tmp_path / "saved"
    CrossEncoder(str(tiny_classifiers[labels]), activation_fn=saved).save_pretrained(str(directory))
    assert (directory / "config_sentence_transformers.json").is_file()
    assert task_of(config_of(directory), directory).activation == activation
    assert cross_encoder_activation(directory) == type(saved).__name__


@pytest.mark.parametrize(
    ("changes", "activation", "applied"),
    [  # sentence-transformers 4 and 5 saved it in config.json; older versions under another key
        ({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}},
         "identity", "Identity"),
        ({"sbert_ce_default_activation_function": "torch.nn.Identity"}, "identity", "Identity"),
        # the newer key wins, as in sentence-transformers
        ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"},
          "sbert_ce_default_activation_function": "torch.nn.Identity"}, "sigmoid", "Sigmoid"),
        ({"sentence_transformers": {"activation_fn": None},
          "sbert_ce_default_activation_function": "torch.nn.Identity"}, "sigmoid", "Sigmoid"),
    ],
)  # fmt: skip
def test_an_activation_in_config_json_is_read_as_sentence_transformers_reads_it(
    tiny_classifiers: dict[str, Path],
    tmp_path: Path,
    changes: dict[str, Any],
    activation: str,
    applied: str,
) -> None:
    directory = copy_of(tiny_classifiers["bert-1"], tmp_path, **changes)
    assert task_of(config_of(directory), directory).activation == activation
    assert cross_encoder_activation(directory) == applied


def test_a_saved_cross_encoders_own_config_wins_over_config_json(
    tiny_classifiers: dict[str, Path], tmp_path: Path
) -> None:
    from sentence_transformers import CrossEncoder

    directory = tmp_path / "saved"
    model = CrossEncoder(str(tiny_classifiers["bert-1"]), activation_fn=torch.nn.Identity())
    model.save_pretrained(str(directory))
    config = config_of(directory)
    config["sentence_transformers"] = {"activation_fn": "torch.nn.modules.activation.Sigmoid"}
    (directory / "config.json").write_text(json.dumps(config))
    assert task_of(config, directory).activation == "identity"
    assert cross_encoder_activation(directory) == "Identity"


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("mypackage.activations.Scaled", "not a torch class"),
        ("builtins.print", "not a torch class"),
        ("torch.nn.modules.activation.Tanh", "not supported"),
        ("torch.nn.Sigmoid.evil", "not supported"),
        (42, "not a class path"),
    ],
)
def test_an_activation_embedx_does_not_apply_is_refused(
    tiny_classifiers: dict[str, Path], path: object, says: str
) -> None:
    directory = tiny_classifiers["bert-1"]
    config = {**config_of(directory), "sentence_transformers": {"activation_fn": path}}
    with pytest.raises(InvalidModel, match=says):
        task_of(config, directory)


def test_a_cross_encoder_of_another_architecture_is_refused(minilm_dir: Path) -> None:
    config = {**config_of(minilm_dir), "architectures": ["Qwen3ForCausalLM"],
              "sentence_transformers": {"activation_fn": "torch.nn.Sigmoid"}}  # fmt: skip
    with pytest.raises(InvalidModel, match="Qwen3ForCausalLM"):
        task_of(config, minilm_dir)


def test_a_saved_cross_encoder_with_modules_after_its_transformer_is_refused(
    tiny_classifiers: dict[str, Path], tmp_path: Path
) -> None:
    from sentence_transformers import CrossEncoder

    directory = tmp_path / "saved"
    CrossEncoder(str(tiny_classifiers["bert-1"])).save_pretrained(str(directory))
    modules = json.loads((directory / "modules.json").read_text())
    modules.append({"idx": 1, "name": "1", "path": "1_Dense",
                    "type": "sentence_transformers.base.modules.dense.Dense"})  # fmt: skip
    (directory / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(InvalidModel, match="Dense"):
        task_of(config_of(directory), directory)


def test_labels_are_id2label_in_id_order_or_num_labels_named_as_transformers_names_them(
    tiny_classifiers: dict[str, Path],
) -> None:
    from transformers import AutoConfig

    directory = tiny_classifiers["bert-3"]
    config = {**config_of(directory), "id2label": {"2": "c", "0": "a", "1": "b"}}
    assert task_of(config, directory).labels == ("a", "b", "c")
    for changes in ({"num_labels": 4}, {}):
        config = {**config_of(directory), "id2label": None, "label2id": None, **changes}
        id2label = AutoConfig.for_model(**config).id2label or {}
        expected = {int(i): label for i, label in id2label.items()}
        task = task_of(config, directory)
        assert task.labels == tuple(expected[i] for i in range(len(expected)))
        assert task.activation == "softmax"


@pytest.mark.parametrize(
    "id2label",
    [{"0": "a", "2": "c"}, {"x": "a"}, {}, ["a", "b"]],
    ids=["gap", "name", "empty", "list"],
)
def test_labels_that_are_not_ids_0_to_n_are_refused(
    tiny_classifiers: dict[str, Path], id2label: object
) -> None:
    directory = tiny_classifiers["bert-3"]
    with pytest.raises(InvalidModel, match="id2label"):
        task_of({**config_of(directory), "id2label": id2label}, directory)


def test_activations_turn_logits_into_the_scores_torch_gives() -> None:
    logits = np.array([[-120.0, 0.5, 3.0], [2.0, -1.0, 90.0]], dtype=np.float32)
    tensor = torch.from_numpy(logits)
    np.testing.assert_allclose(activate(logits, "sigmoid"), torch.sigmoid(tensor), atol=1e-7)
    np.testing.assert_allclose(activate(logits, "softmax"), tensor.softmax(1), atol=1e-7)
    assert activate(logits, "identity") is logits
