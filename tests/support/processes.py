"""embedx and Python scripts run as processes of their own, as users run them: in this
process's environment less its EMBEDX_ settings, with patient time limits and the settings
the test names instead."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

from tests.support.settings import patient_environment

ROOT = Path(__file__).parent.parent.parent


def environment(settings: Mapping[str, object] | None = None, **extra: str) -> dict[str, str]:
    """This process's environment without its EMBEDX_ variables, offline, with `settings` (as
    EMBEDX_ variables) over patient time limits, and `extra` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDX_")}
    env.update(HF_HUB_OFFLINE="1", **patient_environment(settings), **extra)
    return env


def run_embedx(
    *args: str, env: Mapping[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`embedx ARGS` to its end, with `env` over `environment()`."""
    return subprocess.run(
        [sys.executable, "-m", "embedx", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**environment(), **(env or {})},
        timeout=300,
    )


def run_script(source: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Python `source` (dedented) with `args`, to its end, in the repository's root: it may
    import tests.support (eventually(), say)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source), *args],
        capture_output=True,
        text=True,
        env=environment(),
        cwd=ROOT,
        timeout=300,
    )
