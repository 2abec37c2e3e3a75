"""Who holds the interpreter lock, and how often: from `load.py --py-spy PREFIX --gil`.

    python bench/gil_holders.py PREFIX-server.txt --seconds S

py-spy with --gil samples only the thread that holds the lock, so a thread's samples over
rate x seconds is its share of the time holding it, and their sum how busy the lock was.
S: the seconds recorded, the sum of the timed passes' `runs_s` in load.py's JSON (the
recording starts a second before them, while the process waits). Each thread's most
sampled innermost frames follow its line.
"""

from __future__ import annotations

import argparse
import collections
import re

from common import SPY_RATE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stacks", help="py-spy's raw output")
    parser.add_argument("--seconds", type=float, required=True, help="seconds recorded")
    parser.add_argument("--top", type=int, default=5, help="innermost frames a thread")
    args = parser.parse_args()
    threads: collections.Counter[str] = collections.Counter()
    frames: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with open(args.stacks) as lines:
        for line in filter(str.strip, lines):
            stack, samples = line.rstrip().rsplit(" ", 1)
            thread, *calls = stack.split(";")
            name = re.sub(r"^thread \(\d+\):? ?", "", thread.strip()) or "unnamed"
            threads[name] += int(samples)
            frames[name][re.sub(r"\(.*/", "(", calls[-1]) if calls else "?"] += int(samples)
    possible = SPY_RATE * args.seconds
    print(f"the lock held {sum(threads.values()) / possible:.0%} of {args.seconds:.1f} s")
    for name, count in threads.most_common():
        print(f"{count / possible:6.1%}  {name}")
        for frame, n in frames[name].most_common(args.top):
            print(f"        {n / possible:6.1%}  {frame[:100]}")


if __name__ == "__main__":
    main()
