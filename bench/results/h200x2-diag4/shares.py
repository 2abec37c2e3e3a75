"""Where the event loop's thread spent its samples, from py-spy's raw --native stacks:
each frame's inclusive share of the thread's samples, C and Rust frames named by symbol.

    python3 shares.py stacks-server.txt.gz [TOP]
"""

import collections
import gzip
import re
import sys

inclusive: collections.Counter[str] = collections.Counter()
total = 0
with gzip.open(sys.argv[1], "rt") as lines:
    for line in lines:
        stack, count = line.rstrip().rsplit(" ", 1)
        frames = stack.split(";")
        if "MainThread" not in frames[0]:
            continue
        total += int(count)
        # a frame is its function and file, without the line number or the directory
        names = {re.sub(r"\(.*/", "(", re.sub(r":\d+\)", ")", f)) for f in frames[1:]}
        for name in names:
            inclusive[name] += int(count)
print(f"{total} samples of the event loop's thread; inclusive shares:")
for name, count in inclusive.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 60):
    if not name.startswith("0x"):
        print(f"{100 * count / total:5.1f}%  {name[:120]}")
