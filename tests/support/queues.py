"""Builders for tests of the scheduling package: a clock the test sets, and jobs queued at once."""

from __future__ import annotations

import random

from embedx.scheduling import ConvergingQueue, Item, Job


class Clock:
    """A queue clock that stands still until the test moves `now`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def job_of(queue: ConvergingQueue, lengths: list[int]) -> Job:
    """A job of texts of these token lengths, all submitted at once."""
    job = Job(len(lengths))
    queue.submit(job, [Item(job, i, n) for i, n in enumerate(lengths)])
    return job


def lognormal_lengths(count: int, seed: int = 0) -> list[int]:
    """Token lengths shaped like real texts': a median near 30, a long tail cut at 512."""
    rng = random.Random(seed)
    return [min(512, max(3, int(rng.lognormvariate(3.4, 0.9)))) for _ in range(count)]
