"""A causal-LM reranker's forward (sentence-transformers' LogitScore): each rendered pair's last
token's final state through the two rows of the LM head its yes and no tokens name, not the
whole vocabulary; packed on embedx's Qwen3 code, else padded through transformers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from embedx.errors import InvalidModel
from embedx.models import qwen3
from embedx.models.loader import chosen_config
from embedx.models.pooling import Pooling, bucketed, pooled_rows

if TYPE_CHECKING:
    import torch

    from embedx.models.packing import PackedBatch
    from embedx.models.source import ModelFiles
    from embedx.models.task import LogitScore

HEAD = "lm_head.weight"


class LogitScorer:
    """(B, 1) float32 logits: a pair's last-token logit of the true token, less that of the
    false token where there is one, as LogitScore subtracts them."""

    def __init__(
        self,
        last_states: Any,
        head: torch.Tensor,
        device: torch.device,
        matmuls: Callable[[int], None] | None = None,
    ) -> None:
        self.last_states = last_states  # (batch, (B,) rows) -> (B, H)
        self.head = head  # (1 or 2, H): the true token's row, then the false one's
        self.bucket_rows = device.type == "cuda"  # see `pooling.bucketed`
        self.matmuls = matmuls  # see ReplicaModel

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        import torch.nn.functional as F

        rows = pooled_rows(batch.cu_seqlens, Pooling.LAST_TOKEN)
        assert rows is not None, "last-token pooling has one row a text"
        if self.bucket_rows:
            rows = bucketed(rows)
        last = self.last_states(batch, rows)[: batch.count]  # (B, H)
        logits = F.linear(last, self.head).float()  # (B, 1 or 2)
        return logits[:, :1] - logits[:, 1:] if logits.shape[1] == 2 else logits


def logit_scorer(
    files: ModelFiles,
    device: torch.device,
    dtype: torch.dtype,
    tokens: LogitScore,
    implementation: str,
) -> tuple[LogitScorer, str]:
    """The scorer of a LogitScore model on `device`, and which code runs it."""
    ids = [tokens.true_id] if tokens.false_id is None else [tokens.true_id, tokens.false_id]
    native = chosen_config(files, implementation)
    if isinstance(native, qwen3.Qwen3Config):
        encoder = qwen3.Qwen3Encoder(native, list(files.weights), device, dtype)
        head = _head_rows(files, ids, encoder.embed, device, dtype)
        return LogitScorer(encoder.forward, head, device, encoder.warm_matmuls), "qwen3"
    if implementation == "native":
        raise InvalidModel(
            f"embedx's own code runs no causal-LM reranker of model_type "
            f"{files.config.get('model_type')!r}",
            param="model",
        )
    model = _TransformersDecoder(files, device, dtype)
    head = _head_rows(files, ids, model.embeddings, device, dtype)
    return LogitScorer(model.last_states, head, device), "transformers"


def _head_rows(
    files: ModelFiles,
    ids: list[int],
    embeddings: torch.Tensor,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The LM head's rows of `ids`: the checkpoint's lm_head where it has one (transformers
    keeps a saved head), else the word embeddings it is tied to."""
    from safetensors import safe_open

    vocab = embeddings.shape[0]
    if any(i >= vocab for i in ids):
        raise InvalidModel(f"LogitScore's token ids {ids} lie outside the {vocab} of the model's "
                           "vocabulary", param="model")  # fmt: skip
    for path in files.weights:
        with safe_open(str(path), framework="pt") as handle:
            if HEAD in handle.keys():  # noqa: SIM118 (a safetensors handle is no dict)
                table = handle.get_slice(HEAD)
                rows = [table[i : i + 1] for i in ids]  # only these rows are read
                import torch

                return torch.cat(rows).to(device=device, dtype=dtype)
    if not files.config.get("tie_word_embeddings", False):
        raise InvalidModel(f"the checkpoint has no {HEAD} and its config ties none to the word "
                           "embeddings", param="model")  # fmt: skip
    return embeddings[ids].clone()


class _TransformersDecoder:
    """Any other causal LM's base model, through transformers, on right-padded rows: the final
    states of the rows asked for."""

    def __init__(self, files: ModelFiles, device: torch.device, dtype: torch.dtype) -> None:
        import transformers
        from transformers import AutoModelForCausalLM

        options: dict[str, Any] = {"use_safetensors": True, "local_files_only": True,
                                   "trust_remote_code": False}  # fmt: skip
        major = int(transformers.__version__.split(".")[0])
        options["dtype" if major >= 5 else "torch_dtype"] = dtype
        model = AutoModelForCausalLM.from_pretrained(str(files.directory), **options)
        self.decoder = model.get_decoder().to(device).eval()  # type: ignore[no-untyped-call]
        head = model.get_output_embeddings()  # type: ignore[no-untyped-call]
        self.embeddings: torch.Tensor = head.weight.to(device)
        self.pad_id = int(files.config.get("pad_token_id") or 0)

    def last_states(self, batch: PackedBatch, rows: torch.Tensor) -> torch.Tensor:
        """(len(rows), H): the states of packed token `rows`, from a padded forward."""
        import torch

        count, width = batch.count, batch.max_len
        where = batch.padded_index  # each packed token's place in the (count, width) rows
        device = where.device
        padded = torch.full((count * width,), self.pad_id, dtype=torch.long, device=device)
        padded[where] = batch.input_ids[: batch.tokens].long()
        mask = (torch.arange(width, device=device) < batch.lengths.unsqueeze(1)).long()
        states = self.decoder(input_ids=padded.view(count, width), attention_mask=mask)
        flat: torch.Tensor = states.last_hidden_state.reshape(count * width, -1)
        return flat[where[rows]]
