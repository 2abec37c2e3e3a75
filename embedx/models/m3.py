"""BGE-M3 on one device: its encoder's dense rows, and from the same forward its `sparse_linear`
token weights and `colbert_linear` token vectors, as FlagEmbedding's BGEM3FlagModel makes them;
the heads found beside the weights, and converted once from the torch pickles BGE-M3 ships.

A head is a Linear over the last layer's token states: sparse_linear (H -> 1, then relu) weighs
each token, colbert_linear (H -> C) gives each token after the first a vector. The weights are
merged by token id and the vectors normalized on the device, a batch at a time, so that the
host only reads them out (engine/sparse_rows.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from embedx.errors import InvalidModel, PickleOnlyWeights
from embedx.models.loader import ACTIVATIONS, EmbeddingModel, torch_dtype
from embedx.models.pooling import Pooling, pool

if TYPE_CHECKING:
    import torch

    from embedx.models.packing import PackedBatch
    from embedx.models.source import ModelFiles

HEADS = {"sparse": "sparse_linear", "colbert": "colbert_linear"}  # output -> its file's stem
# BGEM3FlagModel leaves these special tokens out of a sparse row, by their tokenizer's names
UNWEIGHTED = ("cls_token", "eos_token", "pad_token", "unk_token")
DROPPED = (1 << 63) - 1  # the sort key of a token a sparse row leaves out: after every other


@dataclass(frozen=True, slots=True)
class M3Heads:
    """What a model's heads add: its outputs (dense first), and the token ids sparse rows skip."""

    outputs: tuple[str, ...]
    unweighted: tuple[int, ...]


def found_heads(directory: Path) -> M3Heads | None:
    """BGE-M3's heads beside a model's weights, as safetensors; None where there are none. Heads
    only as torch pickles are refused: embedx never unpickles while loading."""
    found = [name for name, stem in HEADS.items() if (directory / f"{stem}.safetensors").is_file()]
    pickled = [stem for name, stem in HEADS.items()
               if name not in found and (directory / f"{stem}.pt").is_file()]  # fmt: skip
    if pickled:
        raise PickleOnlyWeights(
            f"the model's {' and '.join(pickled)} heads are torch pickles (.pt), which embedx "
            "never loads (a pickle can run code). Convert them once, where you trust the "
            "files: embedx convert-heads DIR writes them as safetensors beside",
            param="model",
        )
    if not found:
        return None
    return M3Heads(("dense", *found), _special_ids(directory))


def _special_ids(directory: Path) -> tuple[int, ...]:
    """The ids of the tokenizer's cls, eos, pad and unk tokens, as transformers names them."""
    from tokenizers import Tokenizer

    named: dict[str, object] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = directory / name
        if path.is_file():
            named = {**json.loads(path.read_text()), **named}
    vocabulary = Tokenizer.from_file(str(directory / "tokenizer.json"))
    ids = set()
    for key in UNWEIGHTED:
        token = named.get(key)
        content = token.get("content") if isinstance(token, dict) else token
        found = vocabulary.token_to_id(content) if isinstance(content, str) else None
        if found is not None:
            ids.add(found)
    return tuple(sorted(ids))


def convert_heads(directory: Path) -> list[Path]:
    """Write each head of `directory` that is a torch pickle as safetensors beside it, read with
    torch.load(weights_only=True) (tensors only, no code); returns the files written."""
    import torch
    from safetensors.torch import save_file

    written = []
    for stem in HEADS.values():
        pickled = directory / f"{stem}.pt"
        if not pickled.is_file():
            continue
        state = torch.load(pickled, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or set(state) - {"weight", "bias"}:
            raise InvalidModel(f"{pickled.name} is not a Linear's state (weight and bias)")
        target = pickled.with_suffix(".safetensors")
        save_file({k: v.contiguous() for k, v in state.items()}, str(target))
        written.append(target)
    if not written:
        raise InvalidModel(f"{directory} has no sparse_linear.pt or colbert_linear.pt to convert")
    return written


class M3Model(EmbeddingModel):
    """An embedding model with BGE-M3's heads: `forward` gives its dense rows alone;
    `forward_outputs` any of dense, sparse and colbert from one pass."""

    vocab_rows = False  # its sparse output is already one weight a token: (T,), not (B, V)

    def __init__(
        self,
        files: ModelFiles,
        pooling: Pooling,
        device: torch.device,
        dtype: str,
        implementation: str = "auto",
        unweighted: tuple[int, ...] = (),
    ) -> None:
        import torch
        from safetensors.torch import load_file

        super().__init__(files, pooling, device, dtype, implementation)
        # the token ids a sparse row leaves out (M3Heads.unweighted)
        self.unweighted = torch.tensor(unweighted, dtype=torch.long, device=device)
        self.heads: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, stem in HEADS.items():
            path = files.directory / f"{stem}.safetensors"
            if not path.is_file():
                continue
            tensors = load_file(str(path), device=str(device))
            weight, bias = tensors.get("weight"), tensors.get("bias")
            if weight is None or bias is None or weight.shape[1:] != (self.hidden,):
                raise InvalidModel(f"{path.name} is not a Linear over {self.hidden} states")
            if name == "sparse" and weight.shape[0] != 1:
                raise InvalidModel(f"{path.name} gives {weight.shape[0]} weights a token, not 1")
            target = torch_dtype(dtype)
            self.heads[name] = (weight.to(target), bias.to(target))

    def forward_outputs(
        self, batch: PackedBatch, outputs: tuple[str, ...], unit: bool = False
    ) -> torch.Tensor:
        """(1, N) float32: the batch's `outputs`, in this order, each flattened: dense (B, D)
        rows; sparse, each text's token weights merged by id (`_merged`); colbert (T - B, C)
        vectors of every token but each text's first, L2-normalized if `unit`."""
        import torch
        import torch.nn.functional as F

        with torch.inference_mode():
            t = batch.tokens
            hidden = self.encoder.forward(batch)[:t]  # (T, H): padding rows dropped
            parts = []
            if "dense" in outputs:
                vectors = pool(
                    hidden, batch.cu_seqlens, batch.segments[:t], batch.lengths, self.pooling
                )
                for layer in self.dense:
                    vectors = ACTIVATIONS[layer.activation](
                        F.linear(vectors, layer.weight, layer.bias)
                    )
                parts.append(vectors.reshape(-1))
            if "sparse" in outputs:
                weights = torch.relu(F.linear(hidden, *self.heads["sparse"])).float()[:, 0]
                parts.append(self._merged(batch, weights))
            if "colbert" in outputs:
                later = _later_tokens(batch)  # (T - B,)
                vectors = F.linear(hidden[later], *self.heads["colbert"]).float()
                if unit:
                    vectors = F.normalize(vectors, dim=-1, eps=1e-12)
                parts.append(vectors.reshape(-1))
            return torch.cat(parts).unsqueeze(0)

    def _merged(self, batch: PackedBatch, weights: torch.Tensor) -> torch.Tensor:
        """(B + 1 + 2T,) float32, its int32 parts bit for bit: offsets (B + 1) | ids (T) |
        weights (T). Text b's row is entries offsets[b]:offsets[b + 1]: its token ids ascending,
        each with the largest of its tokens' `weights` (T,), where above 0 and the token is not
        one of `unweighted`, as BGEM3FlagModel merges them; entries past offsets[B] unread.

        Sorted by (text, id), a row's entries are runs of equal keys, each run's place the
        count of runs before it. All of fixed size, so nothing waits for the device; and no
        one place that many entries write (a scatter's atomics would queue on it)."""
        import torch

        t, count = batch.tokens, batch.count
        ids = batch.input_ids[:t].long()
        dropped = (weights <= 0) | torch.isin(ids, self.unweighted)
        keys = (batch.segments[:t] << 32 | ids).masked_fill_(dropped, DROPPED)  # (text, id)
        keys, order = keys.sort()
        weights = weights[order]
        kept = keys != DROPPED  # the dropped sort last, past every run
        first = kept.clone()  # each run's first entry
        first[1:] &= keys[1:] != keys[:-1]
        places = torch.arange(t, device=keys.device)
        slot = torch.where(kept, first.cumsum(0) - 1, places)  # a dropped entry: its own place
        runs = torch.full_like(keys, DROPPED).scatter_(0, slot, keys)  # (T,) ascending
        values = torch.zeros_like(weights).scatter_reduce_(
            0, slot, weights.masked_fill_(~kept, 0), "amax"
        )
        starts = torch.arange(count + 1, device=keys.device) << 32  # each text's first key
        offsets = torch.searchsorted(runs, starts)  # (B + 1,): the runs before each text's
        ints = torch.cat([offsets, runs & 0xFFFFFFFF]).to(torch.int32)
        return torch.cat([ints.view(torch.float32), values])


def _later_tokens(batch: PackedBatch) -> torch.Tensor:
    """(T - B,) int64: the batch's tokens but each text's first, in order. The j-th of them is
    token j + b + 1, b its text: the texts whose later tokens end at or before j."""
    import torch

    count = batch.count
    later = torch.arange(batch.tokens - count, device=batch.cu_seqlens.device)
    ends = batch.cu_seqlens[1:].long() - torch.arange(1, count + 1, device=later.device)
    return later + torch.searchsorted(ends, later, right=True) + 1
