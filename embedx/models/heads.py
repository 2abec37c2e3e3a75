"""A sequence-classification model on one device: the packed BERT-family encoder with its
classification head (or transformers for other architectures; a causal LM's yes/no logits,
causal_scorer.py), one call: packed pairs in, (B, labels) logits out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from embedx.errors import InvalidModel
from embedx.models import bert
from embedx.models.loader import chosen_config, torch_dtype
from embedx.models.pooling import bucketed
from embedx.models.task import ModelTask
from embedx.models.weights import Checkpoint

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from embedx.models.packing import PackedBatch
    from embedx.models.source import ModelFiles


@dataclass(frozen=True, slots=True)
class HeadNames:
    """Where a head's two linear layers sit in the checkpoint: `dense` (H -> H, then tanh) on
    the first token's final state, then `out` (H -> labels). Dropout around them is identity
    at inference."""

    dense: str
    out: str


# transformers' *ForSequenceClassification by model_type, which is how its Auto class picks one
HEADS = {
    # BertForSequenceClassification: the pooler on [CLS], then `classifier`
    "bert": HeadNames("bert.pooler.dense", "classifier"),
    # RobertaClassificationHead (and XLM-R's, CamemBERT's): on <s>
    "roberta": HeadNames("classifier.dense", "classifier.out_proj"),
    "xlm-roberta": HeadNames("classifier.dense", "classifier.out_proj"),
    "camembert": HeadNames("classifier.dense", "classifier.out_proj"),
}


class ClassifierHead:
    """The first token's final state to logits: (B, H) -> (B, labels)."""

    def __init__(
        self,
        names: HeadNames,
        weights: list[Path],
        hidden: int,
        labels: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        # The head's names are whole: its tensors sit outside the base model's prefix.
        ckpt = Checkpoint(weights, (), probe=names.out + ".weight")
        self.dense_w = ckpt.get(names.dense + ".weight", (hidden, hidden), device, dtype)
        self.dense_b = ckpt.get(names.dense + ".bias", (hidden,), device, dtype)
        self.out_w = ckpt.get(names.out + ".weight", (labels, hidden), device, dtype)
        self.out_b = ckpt.get(names.out + ".bias", (labels,), device, dtype)

    def __call__(self, first: torch.Tensor) -> torch.Tensor:
        import torch
        import torch.nn.functional as F

        pooled = torch.tanh(F.linear(first, self.dense_w, self.dense_b))  # (B, H)
        return F.linear(pooled, self.out_w, self.out_b)  # (B, labels)


class Scorer(Protocol):
    @property
    def matmuls(self) -> Callable[[int], None] | None:
        """See ReplicaModel."""
        ...

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """(B, labels) float32 logits."""
        ...


class NativeScorer:
    """The packed encoder, its last layer run for each pair's first token only, then the head."""

    def __init__(self, encoder: bert.BertEncoder, head: ClassifierHead) -> None:
        self.encoder = encoder
        self.head = head
        self.bucket_rows = encoder.word.device.type == "cuda"  # see `pooling.bucketed`
        self.matmuls = encoder.warm_matmuls

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        rows = batch.cu_seqlens[:-1].long()  # each pair's first token: [CLS] or <s>
        if self.bucket_rows:
            rows = bucketed(rows)
        first = self.encoder.forward(batch, rows)[: batch.count]  # (B, H)
        return self.head(first).float()


class ScoringModel:
    """One replica of a model that scores (query, document) pairs: `forward` gives the logits;
    `task.activation` turns them into scores (the engine applies it). `token_types`: whether
    its pairs carry token types (`pairs.reads_token_types`, read once per model)."""

    one_row_per_text = True  # the first token's row of each pair is all the head reads

    def __init__(
        self,
        files: ModelFiles,
        device: torch.device,
        dtype: str,
        implementation: str = "auto",
        *,
        task: ModelTask,
        token_types: bool,
    ) -> None:
        self.device = device
        self.dtype = dtype
        self.task = task
        if task.kind != "score":
            raise InvalidModel(
                f"{files.origin or files.directory} is not a sequence-classification model "
                f"(architectures {files.config.get('architectures')}): it cannot score pairs",
                param="model",
            )
        # Fixed at load: the single-text path of the same encoder never splits types.
        self.reads_token_types = token_types
        self.dimensions = len(task.labels)  # a row of logits per pair
        target = torch_dtype(dtype)
        self.scorer: Scorer
        if task.logit_score is not None:  # a causal LM's yes/no logits (causal_scorer.py)
            from embedx.models.causal_scorer import logit_scorer

            self.scorer, self.implementation = logit_scorer(
                files, device, target, task.logit_score, implementation
            )
            return
        native = _native_config(files, implementation)
        if native is not None:
            names = HEADS[files.config["model_type"]]
            weights = list(files.weights)
            labels = len(self.task.labels)
            encoder = bert.BertEncoder(
                native, weights, device, target, token_types=self.reads_token_types
            )
            head = ClassifierHead(names, weights, native.hidden, labels, device, target)
            self.scorer = NativeScorer(encoder, head)
            self.implementation = "bert"
        else:
            from embedx.models.transformers_classifier import TransformersClassifier

            self.scorer = TransformersClassifier(files, device, target, self.reads_token_types)
            self.implementation = "transformers"

    @property
    def labels(self) -> tuple[str, ...]:
        return self.task.labels

    @property
    def matmuls(self) -> Callable[[int], None] | None:
        return self.scorer.matmuls

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """(B, labels) float32 logits for a packed batch of pairs (`pairs.encode_pairs`)."""
        import torch

        with torch.inference_mode():
            return self.scorer.forward(batch)


def _native_config(files: ModelFiles, implementation: str) -> bert.BertConfig | None:
    """The BERT-family config embedx's own code runs with a head, or None for transformers
    (`loader.chosen_config`, for the model types that have a head here)."""
    native = chosen_config(files, implementation)
    if native is None:
        return None
    model_type = files.config.get("model_type")
    if isinstance(native, bert.BertConfig) and model_type in HEADS:
        return native
    if implementation == "native":
        raise InvalidModel(
            f"embedx's own code has no sequence-classification head for model_type {model_type!r}",
            param="model",
        )
    return None
