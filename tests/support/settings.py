"""Settings as tests build them: the ones a test names, over time limits a busy machine cannot
trip. A batch or a wait for a slot takes milliseconds alone and can take a minute on two
shared cores: a test about a limit names it; no other test runs into it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embedx.config import Settings

PATIENT: dict[str, object] = {
    "batch_timeout_s": 600,  # a device whose batch runs past it is quarantined as hung
    "request_queue_timeout_s": 600,  # a request waiting past it for a slot gets a 503
}


def patient(values: Mapping[str, object] | None = None) -> dict[str, object]:
    """`values` over PATIENT."""
    return {**PATIENT, **(values or {})}


def patient_environment(values: Mapping[str, object] | None = None) -> dict[str, str]:
    """`values` over PATIENT, as EMBEDX_ environment variables."""
    return {f"EMBEDX_{k.upper()}": str(v) for k, v in patient(values).items()}


def settings_of(values: Mapping[str, object] | None = None) -> Settings:
    """Settings of `values` over PATIENT, and nothing from the environment."""
    from embedx.config import load_settings

    return load_settings(patient(values), environ={})
