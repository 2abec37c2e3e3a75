"""The frozen view of a queue and its devices, taken at one moment, that the claim policy reads."""

from __future__ import annotations

from dataclasses import dataclass

from embedx.scheduling.buckets import End


@dataclass(frozen=True, slots=True, eq=False)
class DeviceView:
    """One active device as the policy sees it. Compared by identity, as devices are: two
    devices of equal speed are still two."""

    name: str
    budget: int  # padded tokens a batch may hold now
    rate: float  # tokens/s of its speed fit
    fixed: float  # seconds any batch costs, however small
    spread: float  # how far its batch times stray from the fit, as a share of it
    known: bool  # its speed was measured (a probe or batches run), not only a static score
    launch_s: float  # host seconds a launch holds the event loop
    shares_host: bool  # computes on the host CPU that tokenization also needs
    free_at: float  # when it will have finished the claims it holds
    holding: int  # claims it holds

    def seconds(self, tokens: float) -> float:
        """A batch's expected seconds."""
        return self.fixed + tokens / self.rate

    def effective_rate(self) -> float:
        """Tokens/s sustained with full batches, the fixed cost included."""
        return self.budget / self.seconds(self.budget)


@dataclass(frozen=True, slots=True)
class QueueView:
    """The queue as the policy sees it: its active devices and how much work is left."""

    now: float
    devices: tuple[DeviceView, ...]  # the active ones, in the order they were added
    pending_tokens: int  # queued and not claimed
    unfed_tokens: float  # an estimate of those still being tokenized
    feeding: int  # jobs still being tokenized and submitted
    shortest: int | None  # the length of the first item a claim from the SHORT end takes
    longest: int | None  # and from the LONG end

    def first_length(self, end: End) -> int | None:
        """Length of the first item a claim from `end` would take."""
        return self.longest if end is End.LONG else self.shortest
