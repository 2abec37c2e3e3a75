"""What every benchmark shares: the corpus, the machine's description, JSON output."""

from __future__ import annotations

import gc
import gzip
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from tokenizers import Tokenizer

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
# The repository's root, for what benchmarks share with the tests (tests/support: the
# queue's simulator): imported as `tests.support`, from wherever a benchmark is run.
if str(HERE.parent) not in sys.path:
    sys.path.append(str(HERE.parent))
# Where a corpus named without a path is looked for: bench/README.md says what goes there.
CORPUS_DIR = HERE / "corpora"
# Read twice, these four give about 2.6M tokens (all-MiniLM-L6-v2 tokenizer, 512 cut),
# median 35 tokens, p95 217.
DEFAULT_CORPUS = ("fortunes", "enwiki_paragraphs", "lee_background", "mini_newsgroup")
DEFAULT_REPEAT = 2
SPY_RATE = 200  # py-spy samples a second (load.py --py-spy)
CORPUS_HELP = (
    'JSONL files, one {"text": ...} a line (.gz too), or names of such files in '
    f"{CORPUS_DIR} (default: {' '.join(DEFAULT_CORPUS)})"
)


def corpus_path(name: str) -> Path:
    """A corpus file: the path given, or NAME.jsonl (or .jsonl.gz) in CORPUS_DIR."""
    given = Path(name)
    if given.is_file():
        return given
    for candidate in (CORPUS_DIR / f"{name}.jsonl", CORPUS_DIR / f"{name}.jsonl.gz"):
        if candidate.is_file():
            return candidate
    raise SystemExit(
        f"corpus {name!r} not found: pass a JSONL file with --corpus, or put {name}.jsonl "
        f"in {CORPUS_DIR} (bench/README.md)"
    )


def read_texts(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line)["text"] for line in lines if line.strip()]


def load_corpus(names: Sequence[str] = DEFAULT_CORPUS, repeat: int = DEFAULT_REPEAT) -> list[str]:
    texts: list[str] = []
    for name in names:
        texts.extend(read_texts(corpus_path(name)))
    return [t for t in texts if t.strip()] * repeat


def fast_tokenizer(directory: Path, length: int) -> Tokenizer:
    """A model's `tokenizers` tokenizer as the engine sets it up: no padding (some
    tokenizer.json files pad every text to a fixed length), texts cut at `length` tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(length)
    return tokenizer


def sample(texts: Sequence[str], fraction: float, seed: int = 0) -> list[str]:
    """A seeded random subset: the same length distribution, fewer texts."""
    if fraction >= 1:
        return list(texts)
    rng = random.Random(seed)
    return rng.sample(list(texts), max(1, int(len(texts) * fraction)))


def environment() -> dict[str, Any]:
    import numpy
    import torch

    from embedx.allocator import allocator

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_cores": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "allocator": allocator(),
    }
    for package in ("transformers", "tokenizers", "sentence_transformers"):
        try:
            info[package] = __import__(package).__version__
        except ImportError:
            info[package] = None
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["cuda"] = torch.version.cuda
    return info


def cpu_model() -> str | None:
    """The processor's name, as /proc/cpuinfo gives it: hosts sold as one kind differ in it,
    and the load figures differ from host to host by more than most changes move them."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return None


def batch_sizes(engine: Any) -> dict[str, list[int]]:
    """Per device, how many batches so far fell in each token bucket (the engine's histogram)."""
    return {w.slot.name: list(w.batch_tokens.counts) for w in engine.workers}


def batch_size_change(engine: Any, before: dict[str, list[int]], runs: int = 1) -> dict[str, Any]:
    """Batches per run by size since `before`, keyed "<=BOUND" tokens, for each device."""
    from embedx.telemetry import TOKEN_BUCKETS

    labels = [f"<={bound}" for bound in TOKEN_BUCKETS] + [f">{TOKEN_BUCKETS[-1]}"]
    now = batch_sizes(engine)
    return {
        name: {
            label: round((after - was) / runs, 1)
            for label, after, was in zip(labels, counts, before[name], strict=True)
            if after != was
        }
        for name, counts in now.items()
    }


async def open_engine(
    directory: Path,
    pooling: str,
    length: int,
    devices: str | None,
    tokens: int,
    name: str | None = None,
) -> Any:
    """An embedx engine for a model directory on `devices` (as EMBEDX_DEVICES spells them;
    None: every device found), at `tokens` tokens a batch; `name` (default: the devices) is
    what its logs call it. The process's collector is tuned as `embedx serve` tunes it
    (embedx.heap.manage): the figures are the engine's as served."""
    from embedx import heap
    from embedx.config import load_settings
    from embedx.devices import discover
    from embedx.engine import EngineOptions, open_engine
    from embedx.models.catalog import ModelSpec
    from embedx.models.pooling import Pooling
    from embedx.models.source import resolve

    # None is a value to load_settings (it overrides the environment): leave devices out
    # to have them found
    given: dict[str, object] = {"max_batch_tokens": tokens}
    if devices is not None:
        given["devices"] = devices
    settings = load_settings(given)
    spec = ModelSpec(
        name=name or str(devices),
        source=str(directory),
        pooling=Pooling(pooling),
        max_seq_len=length,
    )
    options = EngineOptions(max_batch_tokens=tokens)
    heap.manage()
    return await open_engine(spec, resolve(str(directory)), discover(settings), options)


async def take_turns(
    trials: Mapping[str, Callable[[], Awaitable[T]]], runs: int
) -> dict[str, list[T]]:
    """Each trial's results over `runs` rounds, the trials taking turns within a round so
    drifts in the host's speed fall on all of them alike; every other round runs them in
    reverse, so what one leaves behind for the next (garbage to collect, say) does too."""
    got: dict[str, list[T]] = {name: [] for name in trials}
    for round_ in range(runs):
        order = list(trials.items())
        for name, trial in reversed(order) if round_ % 2 else order:
            got[name].append(await trial())
    return got


def median_run(runs: list[T], seconds: Callable[[T], float]) -> T:
    return sorted(runs, key=seconds)[len(runs) // 2]


def paired_ratio(seconds: Sequence[float], base: Sequence[float]) -> float:
    """The median, round by round, of one trial's seconds over another's (`take_turns`): a
    drift in the host's speed between rounds cancels out."""
    return statistics.median(s / b for s, b in zip(seconds, base, strict=True))


class GcClock:
    """Seconds spent in the cyclic garbage collector, and its collections by generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._since = 0.0

    def start(self) -> None:
        gc.callbacks.append(self._tick)

    def stop(self) -> None:
        if self._tick in gc.callbacks:
            gc.callbacks.remove(self._tick)

    def _tick(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._since = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._since
            self.collections[info["generation"]] += 1


def write_json(result: dict[str, Any], out: str | None) -> None:
    text = json.dumps(result, indent=2)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    print(text)


def wait_up(url: str, process: subprocess.Popen[bytes], seconds: float = 600) -> None:
    """Until the server at `url` answers /health; SystemExit if it exits or takes longer."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server at {url} exited with {process.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    process.kill()
    raise SystemExit(f"the server at {url} did not come up in {seconds:.0f} s")
