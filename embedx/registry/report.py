"""What the registry reports of its models: each resident one for /info, the devices its
models lost, and a typed snapshot of its figures for /metrics."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from embedx.engine import EngineState
from embedx.models.source import HUB_PREFIX, PACKAGE_PREFIX, ModelFiles
from embedx.registry.residency import FOREVER, Resident, Weights
from embedx.telemetry import Histogram

if TYPE_CHECKING:
    from embedx.engine.report import EngineReport
    from embedx.registry.loading import Loads


@dataclass(frozen=True, slots=True)
class RegistryReport:
    """The registry's figures, read at once: its models, their loads, and each loaded one's
    engine report."""

    models: int  # names resident or loading
    weights: int  # the copies of weights they share (what EMBEDX_MAX_LOADED_MODELS counts)
    load_seconds: Histogram
    load_failures: dict[str, int]  # by the error's code
    evictions: int
    failing: int  # preloaded models whose last load failed
    engines: list[tuple[str, EngineReport]]  # each loaded copy's, under one of its names


def registry_report(
    residents: Iterable[Resident],
    copies: Iterable[Weights],
    loads: Loads,
    evictions: int,
    failing: int,
) -> RegistryReport:
    models, held = list(residents), list(copies)
    # one series a copy, not one a name (summed over models, a device's would count twice),
    # under the first of its names still resident: the one it was loaded for, while it is
    loaded = [(next(iter(w.names)), w.engine) for w in held if w.engine is not None]
    return RegistryReport(
        models=len(models),
        weights=len(held),
        load_seconds=loads.seconds,
        load_failures=dict(loads.failures),
        evictions=evictions,
        failing=failing,
        engines=[(name, engine.report()) for name, engine in loaded],
    )


def described(resident: Resident, now: float, show_sources: bool) -> dict[str, Any]:
    """A resident model: its engine's report (the figures of the copy of weights it may share
    with other names), its users and its keep-alive."""
    engine = resident.engine
    entry: dict[str, Any] = (
        engine.describe()
        if engine is not None
        else {"model": resident.spec.name, "state": EngineState.LOADING.value}
    )
    if engine is not None:
        entry["model"] = resident.spec.name
        entry.update(_sources(engine.files, show_sources))
    entry["weights"] = resident.weights.id
    entry["shares_weights_with"] = [n for n in resident.weights.names if n != resident.spec.name]
    entry["users"] = resident.users
    keep_alive = resident.keep_alive_s  # None: preloaded, kept for good (JSON has no inf)
    entry["keep_alive_s"] = None if keep_alive == FOREVER else keep_alive
    entry["idle_s"] = 0.0 if resident.users else round(now - resident.last_used, 1)
    return entry


def _sources(files: ModelFiles, show: bool) -> dict[str, str]:
    """Where a model's files come from, as /info shows it: a local directory only as one,
    unless the operator asks to see where (EMBEDX_SHOW_MODEL_SOURCES)."""
    if show:
        return {"source": files.origin, "directory": str(files.directory)}
    if files.origin.startswith((HUB_PREFIX, PACKAGE_PREFIX)):
        return {"source": files.origin}
    return {"source": "local directory"}


def quarantined(residents: Iterable[Resident]) -> list[str]:
    """Devices taken out of service by resident models, as 'model: device (reason)'."""
    return [
        f"{resident.spec.name}: {device.device} ({device.reason})"
        for resident in residents
        if resident.engine is not None
        for device in resident.engine.report().devices
        if not device.up
    ]
