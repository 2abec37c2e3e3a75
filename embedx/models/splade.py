"""SPLADE on one device: a masked LM's vocabulary logits for every token, pooled into one
vocabulary-wide row per text as sentence-transformers' SpladePooling pools them.

Texts run packed, so no padding needs masking: each text's row is the max (or sum) of
log(1 + relu(logit)) over its own tokens. For max, log1p and relu rise with the logit, so the
max of the logits is taken first and they are applied to (B, V) values, not (T, V).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from embedx.models import bert
from embedx.models.loader import chosen_config, torch_dtype
from embedx.models.weights import Checkpoint

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from embedx.models.packing import PackedBatch
    from embedx.models.source import ModelFiles
    from embedx.models.task import Splade

# The MLM head's tensors, by the family that saves them: (dense, its norm, decoder, bias)
HEADS = {
    "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
             "cls.predictions.decoder", "cls.predictions.bias"),
    "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"),
}  # fmt: skip


class MaskedLmHead:
    """BERT's or RoBERTa's MLM head: dense, activation, LayerNorm, then the decoder to
    vocabulary logits. The decoder is its own tensor where the checkpoint has one (transformers
    then leaves it untied), else the word embeddings."""

    def __init__(
        self, config: bert.BertConfig, model_type: str, weights: list[Path],
        device: torch.device, dtype: torch.dtype, word: torch.Tensor,
    ) -> None:  # fmt: skip
        family = "bert" if model_type == "bert" else "roberta"
        dense, norm, decoder, bias = HEADS[family]
        ckpt = Checkpoint(weights, (), probe=dense + ".weight")
        h, v = config.hidden, config.vocab_size

        def get(name: str, *shape: int) -> torch.Tensor:
            return ckpt.get(name, shape, device, dtype)

        self.dense_w, self.dense_b = get(dense + ".weight", h, h), get(dense + ".bias", h)
        self.norm = (get(norm + ".weight", h), get(norm + ".bias", h))
        self.decoder_w = get(decoder + ".weight", v, h) if decoder + ".weight" in ckpt else word
        self.decoder_b = get(decoder + ".bias", v) if decoder + ".bias" in ckpt else get(bias, v)
        self.eps = config.eps
        # BERT's transform uses the config's activation; RoBERTa's head is always exact GELU
        self.activation = config.activation if family == "bert" else "gelu"

    def __call__(self, states: torch.Tensor) -> torch.Tensor:
        """(T, H) token states to (T, V) logits."""
        import torch.nn.functional as F

        x = F.linear(states, self.dense_w, self.dense_b)
        if self.activation == "relu":
            x = F.relu(x)
        else:
            x = F.gelu(x, approximate="none" if self.activation == "gelu" else "tanh")
        x = F.layer_norm(x, (x.shape[-1],), *self.norm, self.eps)
        return F.linear(x, self.decoder_w, self.decoder_b)


class SpladeModel:
    """One replica of a SPLADE model: packed texts in, (B, V) float32 sparse rows out."""

    one_row_per_text = False  # every token's logits count
    vocab_rows = True  # (B, V) rows, which the engine cuts to their non-zeros on the device

    def __init__(
        self,
        files: ModelFiles,
        splade: Splade,
        device: torch.device,
        dtype: str,
        implementation: str = "auto",
    ) -> None:
        self.splade = splade
        target = torch_dtype(dtype)
        native = chosen_config(files, implementation)
        self.logits: Any  # PackedBatch -> (T, V) logits
        if isinstance(native, bert.BertConfig):
            encoder = bert.BertEncoder(native, list(files.weights), device, target)
            head = MaskedLmHead(native, str(files.config.get("model_type")),
                                list(files.weights), device, target, encoder.word)  # fmt: skip
            self.logits = lambda batch: head(encoder.forward(batch)[: batch.tokens])
            self.implementation, self.dimensions = "bert", native.vocab_size
        elif native is None:
            from embedx.models.transformers_auto import TransformersMaskedLm

            masked = TransformersMaskedLm(files, device, target)
            self.logits = masked.forward
            self.implementation, self.dimensions = "transformers", masked.vocab_size
        else:
            from embedx.errors import InvalidModel

            raise InvalidModel(f"model_type {files.config.get('model_type')!r} is no masked LM")

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """(B, V) float32: each text's SPLADE row, zero where no logit was positive."""
        import torch

        with torch.inference_mode():
            logits = self.logits(batch)  # (T, V)
            segments = batch.segments[: batch.tokens]
            rows = torch.zeros(
                (batch.count, logits.shape[1]), dtype=logits.dtype, device=logits.device
            )
            if self.splade.strategy == "max":  # log1p(relu(.)) after the max: it rises
                index = segments[:, None].expand(logits.shape)  # a view: no (T, V) of ids
                rows.scatter_reduce_(0, index, logits, "amax", include_self=False)
                rows = self._activate(rows.float())
            else:
                rows = rows.float().index_add_(0, segments, self._activate(logits.float()))
            return rows

    def forward_outputs(self, batch: PackedBatch, outputs: tuple[str, ...]) -> torch.Tensor:
        """A SPLADE model's one output, its sparse rows: (B, V) as `forward` gives them."""
        return self.forward(batch)

    def _activate(self, x: torch.Tensor) -> torch.Tensor:
        x = x.relu_().log1p_()
        return x.log1p_() if self.splade.twice else x
