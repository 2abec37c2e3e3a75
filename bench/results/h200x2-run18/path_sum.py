"""Scratch (h200x2-run18): medians of where a request's time went, from the rows that
path-timing.patch has the load stage's clients write (SCRATCH_OUT=DIR/NAME), the warm-up
pass left out. Usage: python3 path_sum.py DIR/NAME ..."""

import glob
import statistics
import sys

NAMES = ("arrive", "read_body", "parse", "admit_lease", "engine", "build", "back")

for prefix in sys.argv[1:]:
    rows: list[tuple[float, ...]] = []
    for path in glob.glob(prefix + ".*"):
        with open(path) as file:
            passes = file.read().split("#\n")[2:]  # [0] is empty, [1] the warm-up
        for text in passes:
            rows += [tuple(map(float, line.split(","))) for line in text.splitlines() if line]
    for name, average in (("median", statistics.median), ("mean", statistics.fmean)):
        ms = {n: round(1000 * average([row[i] for row in rows]), 1) for i, n in enumerate(NAMES)}
        print(prefix, len(rows), f"{name} ms", ms)
