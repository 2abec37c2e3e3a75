"""Any other architecture, through transformers' AutoModel on padded batches (the fallback); a
masked LM's logits the same way, for SPLADE."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from embedx.models.packing import PackedBatch
    from embedx.models.source import ModelFiles


def from_pretrained_options(dtype: torch.dtype) -> dict[str, Any]:
    """from_pretrained's options. use_safetensors: never fall back to a pickle, even if one sits
    beside the weights; trust_remote_code: never run a checkpoint's own Python (its config's
    `auto_map`), nor ask a terminal whether to, as transformers does when left to its default."""
    import transformers

    options: dict[str, Any] = {
        "use_safetensors": True,
        "local_files_only": True,
        "trust_remote_code": False,
    }
    major = int(transformers.__version__.split(".")[0])
    options["dtype" if major >= 5 else "torch_dtype"] = dtype
    return options


class TransformersEncoder:
    """Unpacks each batch into right-padded rows, runs AutoModel, packs the states again."""

    def __init__(self, files: ModelFiles, device: torch.device, dtype: torch.dtype) -> None:
        from transformers import AutoModel

        from embedx.errors import InvalidModel

        self.model, loading = AutoModel.from_pretrained(
            str(files.directory), output_loading_info=True, **from_pretrained_options(dtype)
        )
        # Weights the checkpoint lacks are random: refuse, but for the pooler (which embedx
        # never runs, and sentence-transformers checkpoints often drop) and buffers.
        missing = [
            key
            for key in loading["missing_keys"]
            if not key.startswith("pooler.") and not key.endswith("position_ids")
        ]
        if missing:
            kind = files.config.get("model_type")
            raise InvalidModel(
                f"{files.origin}: its weights lack {len(missing)} of the {kind!r} architecture's "
                f"tensors ({', '.join(sorted(missing)[:3])}, ...): does config.json describe "
                "these weights?",
                param="model",
            )
        self.model.to(device).eval()
        self.pad_id = int(files.config.get("pad_token_id") or 0)
        # transformers maps each architecture's own name for it (DistilBERT's `dim`)
        self.hidden_size = int(self.model.config.hidden_size)
        self.causal = bool(getattr(self.model.config, "is_decoder", False)) or (
            files.config.get("model_type") in ("qwen2", "qwen3", "llama", "mistral", "gemma")
        )

    def forward(self, batch: PackedBatch, pooled: torch.Tensor | None = None) -> torch.Tensor:
        import torch

        count, width = batch.count, batch.max_len
        where = batch.padded_index
        ids = torch.full((count * width,), self.pad_id, dtype=torch.long, device=where.device)
        ids[where] = batch.input_ids[: batch.tokens].long()
        mask = (torch.arange(width, device=where.device) < batch.lengths.unsqueeze(1)).long()
        states = self.model(input_ids=ids.view(count, width), attention_mask=mask)
        hidden: torch.Tensor = states.last_hidden_state  # (B, L, H)
        return hidden.reshape(count * width, -1)[where if pooled is None else where[pooled]]


class TransformersMaskedLm:
    """A masked LM through AutoModelForMaskedLM, on padded rows: its (T, V) logits, packed."""

    def __init__(self, files: ModelFiles, device: torch.device, dtype: torch.dtype) -> None:
        from transformers import AutoModelForMaskedLM

        from embedx.errors import InvalidModel

        self.model, loading = AutoModelForMaskedLM.from_pretrained(
            str(files.directory), output_loading_info=True, **from_pretrained_options(dtype)
        )
        missing = [key for key in loading["missing_keys"] if not key.endswith("position_ids")]
        if missing:
            raise InvalidModel(
                f"{files.origin}: its weights lack {len(missing)} of the masked LM's tensors "
                f"({', '.join(sorted(missing)[:3])}, ...)",
                param="model",
            )
        self.model.to(device).eval()
        self.pad_id = int(files.config.get("pad_token_id") or 0)
        self.vocab_size = int(self.model.config.vocab_size)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        import torch

        count, width = batch.count, batch.max_len
        where = batch.padded_index
        ids = torch.full((count * width,), self.pad_id, dtype=torch.long, device=where.device)
        ids[where] = batch.input_ids[: batch.tokens].long()
        mask = (torch.arange(width, device=where.device) < batch.lengths.unsqueeze(1)).long()
        logits: torch.Tensor = self.model(input_ids=ids.view(count, width), attention_mask=mask)[0]
        return logits.reshape(count * width, -1)[where]  # (T, V)
