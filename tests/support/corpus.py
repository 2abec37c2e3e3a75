"""The texts the tests embed: the reference corpus, and Lee50 with its human similarity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent.parent / "data"


def texts_of(name: str) -> list[str]:
    """The `text` of each line of data/NAME.jsonl."""
    with open(DATA / f"{name}.jsonl") as lines:
        return [json.loads(line)["text"] for line in lines]


def lee50() -> tuple[list[str], np.ndarray]:
    """Lee50's 50 documents, and the (50, 50) similarity people gave each pair."""
    return texts_of("lee50"), np.loadtxt(DATA / "lee50_similarity.txt")
