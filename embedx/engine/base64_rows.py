"""Vectors as the OpenAI API's base64: each row the standard base64 of its little-endian
float32 bytes, as ASCII in one uint8 array row. On the device where a batch ran, so the host
thread that feeds every device never encodes; on the host for the rows that cannot be."""

from __future__ import annotations

import binascii
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

PAD = ord("=")


def width(dimensions: int) -> int:
    """Characters a row of `dimensions` float32 values takes in base64."""
    return 4 * -(-4 * dimensions // 3)


def _padding(row_bytes: int) -> int:
    """Zero bytes that complete a row's last three-byte group: its trailing '=' count."""
    return -row_bytes % 3


def encode_on_host(rows: np.ndarray) -> np.ndarray:
    """(N, D) floats to (N, width(D)) uint8 base64, every row in one binascii call."""
    raw = np.ascontiguousarray(rows, dtype="<f4").view(np.uint8)
    pad = _padding(raw.shape[1])
    if pad:  # whole groups a row, so that the rows' encodings are concatenated
        raw = np.concatenate([raw, np.zeros((len(raw), pad), np.uint8)], axis=1)
    flat = bytearray(binascii.b2a_base64(raw.data, newline=False))  # writable, for torch
    encoded = np.frombuffer(flat, np.uint8).reshape(len(raw), -1)
    if pad:
        encoded[:, -pad:] = PAD
    return encoded


def encode_on_device(vectors: torch.Tensor) -> torch.Tensor:
    """(B, D) float32 on a device to (B, width(D)) uint8 base64 there: a few element-wise
    kernels on the batch's stream, every temporary a byte an output character, and a third
    more bytes to copy back. (A byte view of a tensor is in the machine's order:
    little-endian wherever torch runs CUDA.)"""
    import torch
    import torch.nn.functional as F

    raw = vectors.contiguous().view(torch.uint8)
    pad = _padding(raw.shape[1])
    if pad:
        raw = F.pad(raw, (0, pad))
    b0, b1, b2 = raw.view(len(raw), -1, 3).unbind(-1)
    sextets = torch.stack(
        (b0 >> 2, (b0 & 3) << 4 | b1 >> 4, (b1 & 15) << 2 | b2 >> 6, b2 & 63), dim=-1
    )
    # The alphabet by arithmetic, not a table kept on each device: 'A' + sextet, shifted
    # where each later run starts: at 26 to 'a' (+6), at 52 to '0' (-75), at 62 to '+'
    # (-15), at 63 to '/' (+3). Bytes wrap, which these sums allow.
    encoded = sextets + ord("A")
    for start, shift in ((26, 6), (52, -75), (62, -15), (63, 3)):
        encoded += (sextets >= start).to(torch.uint8) * (shift % 256)
    encoded = encoded.view(len(raw), -1)
    if pad:
        encoded[:, -pad:] = PAD
    return encoded
