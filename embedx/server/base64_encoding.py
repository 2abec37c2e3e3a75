"""The OpenAI response's base64 rows, built in whole-array numpy calls that release the GIL.

A busy server's one event-loop thread feeds every device, and `binascii` holds the GIL for
every byte it encodes: in the H200 load profile it took an eighth of that thread's time
(bench/results/h200x2-diag4). Run in a worker thread, these calls leave the GIL free for
the loop while they run.
"""

from __future__ import annotations

import numpy as np

_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_CHARS = np.frombuffer(_ALPHABET, np.uint8).astype("<u2")
_CODES = np.arange(4096)
# Every 12-bit value as its two base64 characters, the first in the low byte: two lookups
# encode three bytes.
_PAIRS = _CHARS[_CODES >> 6] | (_CHARS[_CODES & 63] << 8)

_HEAD = np.frombuffer(b'{"object":"embedding","index":', np.uint8)
_MIDDLE = np.frombuffer(b',"embedding":"', np.uint8)
_TAIL = np.frombuffer(b'"},', np.uint8)


def encode_rows(vectors: np.ndarray) -> np.ndarray:
    """(N, D) vectors -> (N, L) ASCII: each row's little-endian float32 bytes in base64."""
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    count, width = rows.shape[0], rows.shape[1] * 4
    data = rows.view(np.uint8).reshape(count, width)
    spare = -width % 3  # bytes short of whole 3-byte groups: zeros, then '=' in the text
    if spare:
        data = np.concatenate([data, np.zeros((count, spare), np.uint8)], axis=1)
    groups = data.reshape(count, -1, 3)
    value = groups[..., 0].astype(np.uint32)
    value <<= 8
    value |= groups[..., 1]
    value <<= 8
    value |= groups[..., 2]
    text = np.empty((*value.shape, 2), "<u2")
    np.take(_PAIRS, value >> 12, out=text[..., 0])
    value &= 4095
    np.take(_PAIRS, value, out=text[..., 1])
    encoded = text.view(np.uint8).reshape(count, -1)
    if spare:
        encoded[:, encoded.shape[1] - spare :] = ord("=")
    return encoded


def json_items(vectors: np.ndarray) -> bytes:
    """The `data` array's items, comma-separated: `{"object":"embedding","index":i,
    "embedding":"<base64>"}` for each row in order. Rows are written in blocks of equal
    index width (0-9, 10-99, ...), each one array."""
    encoded = encode_rows(vectors)
    count, length = encoded.shape
    blocks = []
    start, digits = 0, 1
    while start < count:
        stop = min(count, 10**digits)
        block = np.empty(
            (stop - start, len(_HEAD) + digits + len(_MIDDLE) + length + len(_TAIL)), np.uint8
        )
        at = len(_HEAD)
        block[:, :at] = _HEAD
        index = np.arange(start, stop)
        for power in range(digits - 1, -1, -1):
            block[:, at] = index // 10**power % 10 + ord("0")
            at += 1
        block[:, at : at + len(_MIDDLE)] = _MIDDLE
        at += len(_MIDDLE)
        block[:, at : at + length] = encoded[start:stop]
        block[:, at + length :] = _TAIL
        blocks.append(block.tobytes())
        start, digits = stop, digits + 1
    return b"".join(blocks)[:-1]  # the last item's trailing comma
