"""SPLADE on one device: a masked LM's vocabulary logits for every token, pooled into one
vocabulary-wide row per text as sentence-transformers' SpladePooling pools them.

Texts run packed, so no padding needs masking: each text's row is the max (or sum) of
log(1 + relu(logit)) over its own tokens. For max, log1p and relu rise with the logit, so the
max of the logits is taken first and they are applied to (B, V) values, not (T, V). The MLM
decoder runs on a chunk of tokens at a time, pooled into the texts' running rows, so that at
most `CHUNK` logits exist at once.
"""

from __future__ import annotations

from collections.abc import Callable
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

# The most logits a chunk of tokens makes (256 MiB in bfloat16): 4,397 tokens of a 30,522-id
# vocabulary, a product still large enough to keep a GPU busy
CHUNK = 1 << 27
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

    def transform(self, states: torch.Tensor) -> torch.Tensor:
        """(T, H) token states to the (T, H) the decoder reads."""
        import torch.nn.functional as F

        x = F.linear(states, self.dense_w, self.dense_b)
        if self.activation == "relu":
            x = F.relu(x)
        else:
            x = F.gelu(x, approximate="none" if self.activation == "gelu" else "tanh")
        return F.layer_norm(x, (x.shape[-1],), *self.norm, self.eps)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """(c, H) transformed states to (c, V) logits."""
        import torch.nn.functional as F

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
        # On a GPU a chunk is pooled by a segment reduction over each text's contiguous tokens:
        # a scatter's atomics would serialize, a text's tokens all writing the same V places.
        # On a CPU torch's segment reduction (one thread, strided reads) is 5x its scatter's time.
        self._pool = _by_segments if device.type == "cuda" else _by_scatter
        target = torch_dtype(dtype)
        native = chosen_config(files, implementation)
        # PackedBatch -> (T, X) token states, then a chunk of them -> (c, V) logits
        self.states: Any
        self.logits: Any
        self.matmuls: Callable[[int], None] | None = None  # see ReplicaModel
        if isinstance(native, bert.BertConfig):
            encoder = bert.BertEncoder(native, list(files.weights), device, target)
            self.matmuls = encoder.warm_matmuls
            head = MaskedLmHead(native, str(files.config.get("model_type")),
                                list(files.weights), device, target, encoder.word)  # fmt: skip
            self.states = lambda batch: head.transform(encoder.forward(batch)[: batch.tokens])
            self.logits = head.decode
            self.implementation, self.dimensions = "bert", native.vocab_size
        elif native is None:
            from embedx.models.transformers_auto import TransformersMaskedLm

            masked = TransformersMaskedLm(files, device, target)
            self.states = masked.forward  # its logits whole: its head is transformers'
            self.logits = _same
            self.implementation, self.dimensions = "transformers", masked.vocab_size
        else:
            from embedx.errors import InvalidModel

            raise InvalidModel(f"model_type {files.config.get('model_type')!r} is no masked LM")

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """(B, V) float32: each text's SPLADE row, zero where no logit was positive."""
        import torch

        with torch.inference_mode():
            states = self.states(batch)  # (T, X)
            tokens = states.shape[0]
            most = self.splade.strategy == "max"
            # the texts' rows over the chunks so far, from 0: for max, the max of relu(logits)
            rows = torch.zeros((batch.count, self.dimensions), device=states.device,
                               dtype=states.dtype if most else torch.float32)  # fmt: skip
            step = max(1, CHUNK // self.dimensions)
            for start in range(0, tokens, step):
                end = min(start + step, tokens)
                logits = self.logits(states[start:end])  # (c, V)
                values = logits if most else self._activate(logits.float())
                self._pool(rows, values, batch, start, end, "max" if most else "sum")
            return self._activate(rows.float()) if most else rows  # log1p after the max: it rises

    def forward_outputs(
        self, batch: PackedBatch, outputs: tuple[str, ...], unit: bool = False
    ) -> torch.Tensor:
        """A SPLADE model's one output, its sparse rows: (B, V) as `forward` gives them."""
        return self.forward(batch)

    def _activate(self, x: torch.Tensor) -> torch.Tensor:
        x = x.relu_().log1p_()
        return x.log1p_() if self.splade.twice else x


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


def _by_segments(
    rows: torch.Tensor, values: torch.Tensor, batch: PackedBatch, start: int, end: int, how: str
) -> None:
    """Pool tokens start:end's (c, V) `values` into the texts' (B, V) `rows` by max or sum:
    each text's tokens in the chunk, a segment of them (most texts' empty)."""
    import torch

    offsets = batch.cu_seqlens.clamp(start, end) - start  # (B + 1,)
    part = torch.segment_reduce(values, how, offsets=offsets, unsafe=True, initial=0.0)
    if how == "max":
        torch.maximum(rows, part, out=rows)
    else:
        rows.add_(part)


def _by_scatter(
    rows: torch.Tensor, values: torch.Tensor, batch: PackedBatch, start: int, end: int, how: str
) -> None:
    """`_by_segments`' pooling, by each token's text."""
    segments = batch.segments[start:end]
    if how == "max":
        index = segments[:, None].expand(values.shape)  # a view: no (c, V) of ids
        rows.scatter_reduce_(0, index, values, "amax")
    else:
        rows.index_add_(0, segments, values)
