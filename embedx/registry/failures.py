"""Loads that failed: remembered for a while, so that retries do not read the files again nor
evict a healthy model for one that cannot load; and told to clients without the disk's paths."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from embedx.errors import (
    Bug,
    EmbedxError,
    InvalidOption,
    NoDeviceFits,
    PoolingRequired,
    ShuttingDown,
)
from embedx.models.catalog import ModelSpec
from embedx.models.source import HUB_PREFIX, PACKAGE_PREFIX, ModelFiles, local_directory

# A load that failed (broken weights, no such model, a device that keeps failing) is
# answered from memory this long.
FAILED_LOAD_MEMORY_S = 30.0


@dataclass(frozen=True, slots=True)
class FailedLoad:
    """What a failed load told its requests: its error's kind and words, not the error
    itself, whose traceback holds every tensor the load had made."""

    at: float
    kind: type[EmbedxError]
    message: str
    param: str | None


def remembered(error: BaseException) -> bool:
    """Whether a load's error is the model's own: not a request's options (a length past the
    model's, a pooling it did not state), not memory that others' models held (freed as they
    finish or idle out), not embedx's own bug."""
    forgotten = ShuttingDown | InvalidOption | PoolingRequired | NoDeviceFits | Bug
    return isinstance(error, EmbedxError) and not isinstance(error, forgotten)


class FailedLoads:
    """The models whose last load failed lately, by name."""

    def __init__(self, clock: Callable[[], float], memory_s: float = FAILED_LOAD_MEMORY_S) -> None:
        self.clock = clock
        self.memory_s = memory_s
        self._failed: dict[str, FailedLoad] = {}

    def remember(self, name: str, error: EmbedxError) -> None:
        now = self.clock()
        self._failed = {  # the expired go, so that many names keep no memory
            known: failed
            for known, failed in self._failed.items()
            if now - failed.at < self.memory_s
        }
        self._failed[name] = FailedLoad(now, type(error), error.message, error.param)

    def get(self, name: str) -> FailedLoad | None:
        return self._failed.get(name)

    def check(self, name: str) -> None:
        """Raise again the error of this model's load if it failed lately."""
        failed = self._failed.get(name)
        if failed is None:
            return
        left = self.memory_s - (self.clock() - failed.at)
        if left <= 0:
            del self._failed[name]
            return
        raise failed.kind(
            f"{failed.message} (its load failed {self.memory_s - left:.0f} s ago; it is "
            f"tried again {left:.0f} s from now)",
            param=failed.param,
        )


def hide_directory(error: EmbedxError, spec: ModelSpec, files: ModelFiles | None) -> None:
    """Put the model's name where the error of its load says where its files lie (embedx's
    messages name files relative to the model's directory, but transformers' and others' name
    the directory): no client is told where a model's files are on the server's disk."""
    found = {str(files.directory)} if files is not None else set()
    if not spec.source.startswith((HUB_PREFIX, PACKAGE_PREFIX)):
        found.add(spec.source)
        directory = local_directory(spec.source)
        if directory is not None:
            found |= {str(directory), str(directory.resolve())}
    # a relative spelling says nothing of the disk (and `m` would match inside words)
    for spelling in sorted((f for f in found if f.startswith(("/", "~"))), key=len, reverse=True):
        error.message = error.message.replace(spelling, spec.name)
    error.args = (error.message,)
