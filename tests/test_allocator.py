"""Which malloc embedx reports: read from the process's memory maps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from embedx.allocator import allocator
from tests.test_cli import run


def test_a_preloaded_allocator_is_named_and_none_is_libc(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    libc = "7f01a2000000-7f01a2028000 r--p 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
    maps.write_text(libc)
    assert allocator(maps) == "libc"
    jemalloc = "7f01a1000000-7f01a1010000 r-xp 00000000 08:01 99 /usr/lib/libjemalloc.so.2\n"
    maps.write_text(libc + jemalloc)
    assert allocator(maps) == "jemalloc"
    assert allocator(tmp_path / "no-such-maps") == "unknown"


def test_embedx_info_reports_the_allocator_the_loader_preloaded(tmp_path: Path) -> None:
    """A real process: the C library's math library, preloaded under jemalloc's file name,
    shows in its maps as jemalloc would (malloc stays glibc's: only the report is checked)."""
    mapped = Path("/proc/self/maps").read_text().split()
    libm = next(Path(f) for f in mapped if Path(f).name.startswith(("libm.so", "libm-")))
    stand_in = tmp_path / "libjemalloc.so.2"
    shutil.copy(libm, stand_in)
    preloaded = run("info", "--json", env={"LD_PRELOAD": str(stand_in)})
    assert preloaded.returncode == 0, preloaded.stderr
    assert json.loads(preloaded.stdout)["allocator"] == "jemalloc"
    plain = run("info", "--json", env={"LD_PRELOAD": ""})
    assert json.loads(plain.stdout)["allocator"] == "libc"
    assert "allocator: libc" in run("info", env={"LD_PRELOAD": ""}).stdout
