"""Reading a checkpoint's safetensors by explicit name, whatever prefix the saving class added."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from embedx.errors import InvalidModel

if TYPE_CHECKING:
    import torch


class Checkpoint:
    """Tensors of a (possibly sharded) safetensors checkpoint, found by name.

    Task heads save the base model under a prefix (`bert.`, `roberta.`, `model.`); the
    first prefix under which `probe` exists is used for every name.
    """

    def __init__(self, paths: Sequence[Path], prefixes: Sequence[str], probe: str) -> None:
        from safetensors import safe_open

        self._where: dict[str, Path] = {}
        for path in paths:
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (a safetensors handle is no dict)
                    self._where[key] = path
        found = [p for p in ("", *prefixes) if p + probe in self._where]
        if not found:
            raise InvalidModel(f"checkpoint has no {probe!r}: not the architecture it claims")
        self.prefix = found[0]

    def __contains__(self, name: str) -> bool:
        return self.prefix + name in self._where

    def get(
        self, name: str, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        from safetensors import safe_open

        key = self.prefix + name
        path = self._where.get(key)
        if path is None:
            raise InvalidModel(f"checkpoint is missing {key!r}")
        with safe_open(str(path), framework="pt") as handle:
            tensor: torch.Tensor = handle.get_tensor(key)
        if tuple(tensor.shape) != shape:
            raise InvalidModel(f"{key!r} has shape {tuple(tensor.shape)}, expected {shape}")
        return tensor.to(device=device, dtype=dtype)
