"""Fit each tokenizer call's wall time as fixed + per-text cost, from the per-call clocks that
h200x2-run13's `timeline.patch` recorded (the server's calls vary in size; the library's are
nearly all 4,096 texts, so its fixed cost is not told apart from its slope).

    python3 call_fit.py ../h200x2-run13/*-timeline-*.json.gz   (from this folder)
"""

from __future__ import annotations

import gzip
import json
import sys

import numpy as np

SIZES = [(100, 600), (600, 3000), (3000, 8193)]  # calls by their texts: [low, high)


def fit(path: str) -> str:
    with gzip.open(path) as file:
        calls = [c for c in json.load(file)["calls"] if "enc_end" in c]
    texts = np.array([c["texts"] for c in calls], float)
    wall = np.array([c["enc_end"] - c["enc_start"] for c in calls])
    cpu = np.array([c["cpu_enc_end"] - c["cpu_enc_start"] for c in calls])
    kept = (texts >= 100) & (texts <= 8192)  # leave out the warm-up's one-text call
    design = np.vstack([np.ones(kept.sum()), texts[kept]]).T
    (fixed, per_text), *_ = np.linalg.lstsq(design, wall[kept], rcond=None)
    (cpu_fixed, cpu_per_text), *_ = np.linalg.lstsq(design, cpu[kept], rcond=None)
    rates = []
    for low, high in SIZES:
        sized = kept & (texts >= low) & (texts < high)
        if sized.any():
            rate = texts[sized].sum() / wall[sized].sum() / 1000
            rates.append(f"{low}-{high} texts: {sized.sum()} calls at {rate:.0f}k texts/s")
    return (
        f"{path}: {kept.sum()} calls of {texts[kept].mean():.0f} texts on average; wall "
        f"{fixed * 1e3:.1f} ms + {per_text * 1e6:.1f} us a text; the calling thread's CPU "
        f"{cpu_fixed * 1e3:.2f} ms + {cpu_per_text * 1e6:.2f} us a text\n  " + "; ".join(rates)
    )


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(fit(name))
