"""Any other sequence-classification architecture, through transformers'
AutoModelForSequenceClassification on padded batches (the fallback for scoring pairs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from embedx.errors import InvalidModel
from embedx.models.pairs import split_types
from embedx.models.transformers_auto import from_pretrained_options

if TYPE_CHECKING:
    import torch

    from embedx.models.packing import PackedBatch
    from embedx.models.source import ModelFiles


class TransformersClassifier:
    """Unpacks each batch of pairs into right-padded rows (with their token types where the
    model reads them) and returns the model's logits."""

    matmuls: Callable[[int], None] | None = None  # see ReplicaModel: transformers' forward

    def __init__(
        self, files: ModelFiles, device: torch.device, dtype: torch.dtype, token_types: bool
    ) -> None:
        from transformers import AutoModelForSequenceClassification

        options = from_pretrained_options(dtype)
        self.model, loading = AutoModelForSequenceClassification.from_pretrained(
            str(files.directory), output_loading_info=True, **options
        )
        # Weights the checkpoint lacks are random: refuse (the head and pooler included: they
        # make the scores), but for buffers.
        missing = [key for key in loading["missing_keys"] if not key.endswith("position_ids")]
        if missing:
            kind = files.config.get("model_type")
            raise InvalidModel(
                f"{files.origin}: its weights lack {len(missing)} of the {kind!r} "
                f"sequence-classification architecture's tensors ("
                f"{', '.join(sorted(missing)[:3])}, ...): does config.json describe these weights?",
                param="model",
            )
        self.model.to(device).eval()
        self.pad_id = int(files.config.get("pad_token_id") or 0)
        self.token_types = token_types

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """(B, labels) float32 logits."""
        import torch

        count, width = batch.count, batch.max_len
        where = batch.padded_index
        device = where.device
        ids = batch.input_ids[: batch.tokens]
        inputs: dict[str, torch.Tensor] = {}
        if self.token_types:
            ids, types = split_types(ids)
            type_ids = torch.zeros(count * width, dtype=torch.long, device=device)
            type_ids[where] = types.long()
            inputs["token_type_ids"] = type_ids.view(count, width)
        padded = torch.full((count * width,), self.pad_id, dtype=torch.long, device=device)
        padded[where] = ids.long()
        mask = (torch.arange(width, device=device) < batch.lengths.unsqueeze(1)).long()
        out = self.model(input_ids=padded.view(count, width), attention_mask=mask, **inputs)
        logits: torch.Tensor = out.logits
        return logits.float()
