"""A corpus job's progress: a bar on a terminal (texts, tokens, tokens/s, ETA from the input's
bytes read), nothing elsewhere, and one summary line at the end either way."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm


class Progress:
    """What this run has embedded, shown as it goes."""

    def __init__(
        self, total_bytes: int, stream: TextIO, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total_bytes = total_bytes
        self.stream = stream
        self.clock = clock
        self.started = clock()
        self.texts = 0
        self.tokens = 0
        self.resumed_chunks = 0
        self._resumed_bytes = 0
        self._bar: tqdm[None] | None = None

    def start(self) -> None:
        self.started = self.clock()

    def skipped(self, position: int) -> None:
        """A chunk an earlier run finished; the input read up to byte `position`."""
        self.resumed_chunks += 1
        self._resumed_bytes = position

    def advance(self, position: int, texts: int, tokens: int) -> None:
        """A chunk of `texts` and `tokens` embedded; the input read up to byte `position`."""
        self.texts += texts
        self.tokens += tokens
        bar = self._open_bar(position)
        if bar is None:
            return
        rate = self.tokens / max(self.clock() - self.started, 1e-9)
        bar.set_postfix_str(
            f"{self.texts:,} texts, {self.tokens:,} tokens, {_short(rate)} tokens/s",
            refresh=False,
        )
        bar.update(position - bar.n)

    def _open_bar(self, position: int) -> tqdm[None] | None:
        if self._bar is None and self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total_bytes,
                initial=self._resumed_bytes,  # the bar's rate and ETA are this run's
                file=self.stream,
                unit="B",
                unit_scale=True,
                bar_format="{percentage:3.0f}%|{bar}| {postfix} [{elapsed}<{remaining}]",
                dynamic_ncols=True,
            )
        return self._bar

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def summary(self, output: str, bad: int, bad_file: str) -> str:
        seconds = self.clock() - self.started
        rate = self.tokens / max(seconds, 1e-9)
        line = (
            f"embedx: embedded {self.texts:,} texts ({self.tokens:,} tokens) in {seconds:.1f} s, "
            f"{_short(rate)} tokens/s, into {output}"
        )
        if self.resumed_chunks:
            line += f" ({self.resumed_chunks} chunks were done by an earlier run)"
        if bad:
            line += f"; {bad} bad lines skipped, listed in {bad_file}"
        return line


def _short(value: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.2f}{unit}"
    return f"{value:.0f}"
