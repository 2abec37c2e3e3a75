"""Vectors as sentence-transformers' `quantize_embeddings` makes them (int8, uint8, binary,
ubinary), bit for bit, on the device where a batch ran or on the host.

int8 and uint8 take the fixed range [-1, 1] for every component, the one every component of
a unit vector lies in: equal to `quantize_embeddings(x, "int8", ranges=np.array([[-1.0] * D,
[1.0] * D]))`; a component of an unnormalized vector beyond it is clipped."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

LOW = np.float32(-1.0)
# One of 256 steps across [LOW, 1], rounded to float32 as quantize_embeddings rounds it
STEP = (np.float32(1.0) - LOW) / np.float32(255)


def bytes_width(dimensions: int) -> int:
    """Bytes a binary row of `dimensions` takes: a bit a component, the last byte padded."""
    return -(-dimensions // 8)


def levels_on_host(rows: np.ndarray) -> np.ndarray:
    """(N, D) floats to their level, 0 to 255, as float32: floor((x - low) / step), clipped."""
    levels: np.ndarray = np.clip(np.floor((np.asarray(rows, np.float32) - LOW) / STEP), 0, 255)
    return levels


def int8_on_host(rows: np.ndarray) -> np.ndarray:
    # NaN (a broken model's, as its smoke test finds) has no level: no warning for it
    with np.errstate(invalid="ignore"):
        return (levels_on_host(rows) - 128).astype(np.int8)


def uint8_on_host(rows: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return levels_on_host(rows).astype(np.uint8)


def ubinary_on_host(rows: np.ndarray) -> np.ndarray:
    """(N, D) to (N, bytes_width(D)) uint8: the sign bits, the first component the high bit."""
    return np.packbits(np.asarray(rows) > 0, axis=-1)


def binary_on_host(rows: np.ndarray) -> np.ndarray:
    """ubinary less 128, as int8: flipping the high bit does it in every byte."""
    return (ubinary_on_host(rows) ^ np.uint8(128)).view(np.int8)


def _levels_on_device(rows: torch.Tensor) -> torch.Tensor:
    import torch

    # Tensors on the device, not Python numbers: CUDA divides by a host scalar as a
    # multiplication by its reciprocal, which rounds differently from numpy's division.
    low = torch.full((), float(LOW), dtype=torch.float32, device=rows.device)
    step = torch.full((), float(STEP), dtype=torch.float32, device=rows.device)
    return torch.clamp(torch.floor((rows.float() - low) / step), 0, 255)


def int8_on_device(rows: torch.Tensor) -> torch.Tensor:
    import torch

    return (_levels_on_device(rows) - 128).to(torch.int8)


def uint8_on_device(rows: torch.Tensor) -> torch.Tensor:
    import torch

    return _levels_on_device(rows).to(torch.uint8)


def ubinary_on_device(rows: torch.Tensor) -> torch.Tensor:
    """numpy's packbits on the device: the bits zero-padded to whole bytes, each byte's eight
    shifted into place (the first the highest) and summed."""
    import torch
    import torch.nn.functional as F

    bits = (rows > 0).to(torch.uint8)
    pad = -bits.shape[1] % 8
    if pad:
        bits = F.pad(bits, (0, pad))
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=rows.device)
    return (bits.view(len(bits), -1, 8) << shifts).sum(-1, dtype=torch.uint8)


def binary_on_device(rows: torch.Tensor) -> torch.Tensor:
    import torch

    return (ubinary_on_device(rows) ^ 128).view(torch.int8)
