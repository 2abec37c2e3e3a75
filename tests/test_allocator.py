"""Which malloc embedx reports (read from the process's memory maps), and the memory it
has glibc give back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from embedx.allocator import GIVE_BACK_AFTER_BYTES, allocator
from embedx.config import load_settings
from embedx.devices import CpuAccelerator
from embedx.models.catalog import load_catalog
from embedx.registry import ModelRegistry
from embedx.server import body as request_body
from embedx.server.app import create_app
from tests.support.fakes import cpu_info
from tests.support.processes import run_embedx
from tests.support.waiting import next_turn


def test_a_preloaded_allocator_is_named_and_none_is_libc(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    libc = "7f01a2000000-7f01a2028000 r--p 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
    maps.write_text(libc)
    assert allocator(maps) == "libc"
    jemalloc = "7f01a1000000-7f01a1010000 r-xp 00000000 08:01 99 /usr/lib/libjemalloc.so.2\n"
    maps.write_text(libc + jemalloc)
    assert allocator(maps) == "jemalloc"
    assert allocator(tmp_path / "no-such-maps") == "unknown"


@pytest.mark.process
def test_embedx_info_reports_the_allocator_the_loader_preloaded(tmp_path: Path) -> None:
    """A real process: the C library's math library, preloaded under jemalloc's file name,
    shows in its maps as jemalloc would (malloc stays glibc's: only the report is checked)."""
    mapped = Path("/proc/self/maps").read_text().split()
    libm = next(Path(f) for f in mapped if Path(f).name.startswith(("libm.so", "libm-")))
    stand_in = tmp_path / "libjemalloc.so.2"
    shutil.copy(libm, stand_in)
    preloaded = run_embedx("info", "--json", env={"LD_PRELOAD": str(stand_in)})
    assert preloaded.returncode == 0, preloaded.stderr
    assert json.loads(preloaded.stdout)["allocator"] == "jemalloc"
    plain = run_embedx("info", "--json", env={"LD_PRELOAD": ""})
    assert json.loads(plain.stdout)["allocator"] == "libc"
    assert "allocator: libc" in run_embedx("info", env={"LD_PRELOAD": ""}).stdout


GIVE_BACK = """
import json
from embedx.allocator import give_back

def rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))

big = b"x" * (30 << 20)  # mapped apart, and handed back when freed: glibc's threshold for
del big  # that now rises to 30 MB (at most 32), so the blocks below come from the heap
blocks = [b"x" * (1 << 20) for _ in range(40)]
del blocks  # free, but kept: below twice the threshold at the heap's top
kept = rss_mb()
gave = give_back()
print(json.dumps({"kept": kept, "gave": gave, "after": rss_mb()}))
"""


@pytest.mark.process
def test_giving_back_returns_to_the_system_what_glibc_kept_of_freed_blocks() -> None:
    environment = {**os.environ, "LD_PRELOAD": ""}  # glibc's malloc, whatever runs the tests
    ran = subprocess.run(
        [sys.executable, "-c", GIVE_BACK], capture_output=True, text=True, env=environment
    )
    assert ran.returncode == 0, ran.stderr
    memory = json.loads(ran.stdout)
    assert memory["gave"]
    assert memory["after"] < memory["kept"] - 30  # the 40 MB, less what pages stay mapped


@pytest.mark.anyio
async def test_a_body_of_megabytes_has_the_server_give_memory_back_after_its_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given_back = threading.Event()
    sizes: list[int] = []
    monkeypatch.setattr(request_body, "give_back_soon", given_back.set)
    settings = load_settings({}, environ={})
    registry = ModelRegistry(settings, load_catalog(None), [cpu_info()], CpuAccelerator)
    transport = httpx.ASGITransport(app=create_app(settings, registry))
    async with httpx.AsyncClient(transport=transport, base_url="http://embedx") as client:
        for size in (GIVE_BACK_AFTER_BYTES - 100, GIVE_BACK_AFTER_BYTES):
            text = "x" * (size - len('{"model":"nowhere","input":""}'))
            body = json.dumps({"model": "nowhere", "input": text}, separators=(",", ":"))
            sizes.append(len(body))
            response = await client.post(
                "/v1/embeddings", content=body, headers={"content-type": "application/json"}
            )
            assert response.status_code == 404  # no such model: read, parsed, answered
            await next_turn()
            assert given_back.is_set() == (size == GIVE_BACK_AFTER_BYTES)
    assert sizes == [GIVE_BACK_AFTER_BYTES - 100, GIVE_BACK_AFTER_BYTES]
