"""SpeedModel: a device's batch time as `fixed + tokens / rate`, fitted to the batches it ran."""

from __future__ import annotations

from collections.abc import Sequence

OUTLIER_FACTOR = 3.0  # the most a batch's time counts against the fit's expectation


class SpeedModel:
    """Batch time as `fixed + tokens / rate`, fitted by exponentially weighted least squares.

    Tokens are real tokens: what padding costs a padded model shows up in its rate.

    Until two different batch sizes have been seen, the rate comes from the prior (a static
    score or a probe measurement) and the fixed cost from the prior fixed cost.
    """

    __slots__ = (
        "_sw",
        "_sx",
        "_sxx",
        "_sxy",
        "_sy",
        "fixed",
        "measured",
        "rate",
        "samples",
        "spread",
    )
    DECAY = 0.85  # weight of older batches: about the last seven dominate

    def __init__(
        self,
        rate: float,
        fixed: float = 0.0,
        *,
        measured: bool = True,
        points: Sequence[tuple[float, float]] = (),
    ) -> None:
        self.rate = rate
        self.fixed = fixed
        self.measured = measured  # the prior was measured (a probe), not a static score
        self.samples = 0
        self._sw = self._sx = self._sy = self._sxx = self._sxy = 0.0
        # How far a batch's time strays from the fit, as a share of it (a moving average):
        # a GPU time-sliced with a co-tenant ran batches 20% over and under (an H200, BERT-large).
        self.spread = 0.0
        # A probe's (tokens, seconds) points seed the fit, so one tiny batch later (a smoke
        # test) cannot pass for the device's speed.
        for tokens, seconds in points:
            self.observe(tokens, seconds)
        self.samples = 0
        self.spread = 0.0  # the probe's first points stray from a fit not yet made

    @property
    def known(self) -> bool:
        """Whether others may count on this speed: measured by a probe or by batches run,
        not only a static score."""
        return self.measured or self.samples > 0

    def seconds(self, tokens: float) -> float:
        return self.fixed + tokens / self.rate

    def effective_rate(self, batch_tokens: float) -> float:
        """Tokens/s sustained with batches of `batch_tokens`, the fixed cost included."""
        return batch_tokens / self.seconds(batch_tokens)

    def observe(self, tokens: float, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        d = self.DECAY
        expected = self.seconds(tokens)
        if self.samples >= 3:
            # One batch far off the fit (a pause, a kernel's first run) counts as a few times
            # off, no more: else the device looks so slow it is not given the batches that
            # would correct the fit. A device that really slowed down still gets there, a few
            # times slower a batch.
            seconds = min(seconds, OUTLIER_FACTOR * expected)
        self.spread = d * self.spread + (1 - d) * abs(seconds - expected) / expected
        self._sw = d * self._sw + 1.0
        self._sx = d * self._sx + tokens
        self._sy = d * self._sy + seconds
        self._sxx = d * self._sxx + tokens * tokens
        self._sxy = d * self._sxy + tokens * seconds
        self.samples += 1
        mean_x, mean_y = self._sx / self._sw, self._sy / self._sw
        var_x = self._sxx / self._sw - mean_x * mean_x
        cov = self._sxy / self._sw - mean_x * mean_y
        if var_x > (0.05 * mean_x) ** 2 and cov > 0:
            per_token = cov / var_x
            fixed = mean_y - per_token * mean_x
            if fixed >= 0:
                self.rate, self.fixed = 1.0 / per_token, fixed
                return
        # One size seen (or a noisy fit): keep the fixed cost, explain the rest by the rate.
        fixed = min(self.fixed, 0.5 * mean_y)
        self.fixed = fixed
        self.rate = mean_x / (mean_y - fixed)
