"""What each output form costs a request, on one loaded engine and the same texts: tokens/s of
each, and its ratio to the same engine's float rows.

    python bench/outputs.py [--models minilm splade m3] [--corpus PATH ...] [--runs N] [--out FILE]

- minilm (all-MiniLM-L6-v2): `float`, `base64`, `int8` and `binary` rows.
- splade: a masked LM of a real shape (`--splade-shape`, bert-base's 30,522-token vocabulary),
  random weights whose decoder bias is lowered until a text's row has about
  `--splade-nonzeros` weights, as a trained SPLADE's have (0: left as built, nearly every
  weight above 0). `sparse`, `sparse` with `--top-k`, and `sparse_whole_rows` (the rows sent
  whole and scanned on the host, as before they were cut on the device); against `float`,
  the same model's encoder loaded beside it as a dense one (CLS pooling, its MLM head unused).
- m3: BGE-M3's heads on a random encoder (`--m3-shape`, xlm-roberta-large as BGE-M3 is):
  `float` (its dense rows), `int8` and `binary` (them quantized on the device), `sparse`,
  `dense_sparse` and `colbert`.

Each trial runs once as a warm-up, then --runs times, the trials taking turns (common.py);
`tokens_per_s` is from the median run, `to_float` the median, round by round, of float's
seconds over the trial's (above 1: faster than float); `deliver_s` each run's seconds of the
event loop delivering batches (their rows read into the request), which on a GPU the next launch
waits behind. Tokenization included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from common import (
    CORPUS_HELP,
    DEFAULT_CORPUS,
    DEFAULT_REPEAT,
    environment,
    load_corpus,
    open_engine,
    paired_ratio,
    take_turns,
    write_json,
)
from throughput import model_directory

from embedx.engine import EmbedOptions
from embedx.models.random_init import SHAPES

Trial = Callable[[], Awaitable[Any]]  # one request of all the texts: its EmbedResult
CALIBRATION_TEXTS = 64


def build_splade(shape: str, directory: Path, tokenizer: Path, texts: list[str],
                 nonzeros: int, tiny: bool, device: str) -> None:  # fmt: skip
    """A random `shape` masked LM, its decoder bias lowered so that a text's SPLADE row (max of
    log(1 + relu(logits)) over its tokens) has about `nonzeros` weights: a calibration sample's
    rows, their max logits ranked, cut at that share of the vocabulary."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from embedx.models.random_init import build_masked_lm

    build_masked_lm(shape, directory, tokenizer, tiny=tiny, device=device)
    if not nonzeros:
        return
    model = AutoModelForMaskedLM.from_pretrained(str(directory)).to(device).eval()
    tokens = AutoTokenizer.from_pretrained(str(directory))
    maxima = []
    with torch.inference_mode():
        for start in range(0, min(len(texts), CALIBRATION_TEXTS), 8):
            batch = tokens(texts[start : start + 8], truncation=True, max_length=128,
                           padding=True, return_tensors="pt").to(device)  # fmt: skip
            logits = model(**batch).logits  # (B, L, V)
            padding = batch["attention_mask"][..., None] == 0
            maxima.append(logits.masked_fill(padding, float("-inf")).amax(1))  # (B, V)
    tops = torch.cat(maxima).flatten().float()  # each text's max logit of each id
    vocab = logits.shape[-1]
    kept = max(1, min(nonzeros, vocab - 1) * len(tops) // vocab)  # how many above the cut
    threshold = float(tops.kthvalue(len(tops) - kept).values)
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    for name in ("cls.predictions.bias", "cls.predictions.decoder.bias", "lm_head.bias",
                 "lm_head.decoder.bias"):  # fmt: skip
        if name in tensors:
            tensors[name] = tensors[name] - threshold
    save_file(tensors, str(path), metadata={"format": "pt"})


def build_m3(shape: str, directory: Path, tokenizer: Path, tiny: bool, device: str) -> None:
    """A random `shape` encoder with BGE-M3's sparse_linear and colbert_linear heads beside it,
    as safetensors (what `embedx convert-heads` makes of BGE-M3's pickles)."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from embedx.models.random_init import build

    build(shape, directory, tokenizer, tiny=tiny, device=device)
    for name in ("modules.json", "sentence_bert_config.json"):  # BGE-M3 pools CLS: no module
        (directory / name).unlink()
    shutil.rmtree(directory / "1_Pooling")
    hidden = json.loads((directory / "config.json").read_text())["hidden_size"]
    torch.manual_seed(0)
    for name, width in (("sparse_linear", 1), ("colbert_linear", hidden)):
        state = torch.nn.Linear(hidden, width).state_dict()
        save_file(
            {k: v.contiguous() for k, v in state.items()}, str(directory / f"{name}.safetensors")
        )


class DeliverClock:
    """Seconds the event loop spends delivering finished batches (`DeviceWorker._deliver`:
    their rows read into their requests), while entered: host work that holds back the next
    launch."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> DeliverClock:
        from embedx.engine.worker import DeviceWorker

        self._deliver = deliver = DeviceWorker._deliver

        def timed(worker: DeviceWorker, *args: Any) -> None:
            started = time.perf_counter()
            try:
                deliver(worker, *args)
            finally:
                self.seconds += time.perf_counter() - started

        DeviceWorker._deliver = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        from embedx.engine.worker import DeviceWorker

        DeviceWorker._deliver = self._deliver  # type: ignore[method-assign]


async def measure(trials: dict[str, Trial], runs: int) -> dict[str, Any]:
    """Each trial's tokens/s and its ratio to `float`, taken in turns after a warm-up each;
    and the seconds of each run that the loop spent delivering batches (`DeliverClock`)."""

    def timed(trial: Trial) -> Callable[[], Awaitable[tuple[float, int, float]]]:
        async def run() -> tuple[float, int, float]:
            with DeliverClock() as clock:
                started = time.perf_counter()
                result = await trial()
                return time.perf_counter() - started, result.tokens, clock.seconds

        return run

    for trial in trials.values():
        await trial()
    got = await take_turns({name: timed(trial) for name, trial in trials.items()}, runs)
    base = [seconds for seconds, _, _ in got["float"]]
    figures = {}
    for name, results in got.items():
        seconds = [s for s, _, _ in results]
        tokens = results[0][1]
        figures[name] = {
            "tokens": tokens,
            "runs_s": [round(s, 4) for s in seconds],
            "deliver_s": [round(d, 4) for _, _, d in results],
            "tokens_per_s": round(tokens / statistics.median(seconds)),
            "to_float": round(paired_ratio(base, seconds), 4),
        }
    return figures


def _encoded(engine: Any, texts: list[str], encoding: str) -> Trial:
    return lambda: engine.embed(texts, EmbedOptions(encodings=(encoding,)))


def _outputs(engine: Any, texts: list[str], *outputs: str, top_k: int | None = None) -> Trial:
    return lambda: engine.embed(texts, EmbedOptions(outputs=outputs, top_k=top_k))


def _whole_rows(engine: Any, texts: list[str]) -> Trial:
    """SPLADE's rows as they were sent before the cut: whole, scanned on the host."""
    compactors = [w.replica.compactor for w in engine.workers if w.replica.compactor]
    vocab = engine.dimensions

    async def run() -> Any:
        kept = [c.capacity for c in compactors]
        for compactor in compactors:
            compactor.capacity = vocab  # 2k + 1 >= V: the rows come back whole
        try:
            return await engine.embed(texts, EmbedOptions(outputs=("sparse",)))
        finally:
            for compactor, capacity in zip(compactors, kept, strict=True):
                compactor.capacity = capacity

    return run


async def bench_minilm(texts: list[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    directory, pooling, length = model_directory("minilm", work, args.tiny, args.device)
    engine = await open_engine(directory, pooling, length, args.devices, args.max_batch_tokens,
                               name="minilm")  # fmt: skip
    try:
        trials = {name: _encoded(engine, texts, name) for name in ("float", "base64", "int8",
                                                                   "binary")}  # fmt: skip
        return {"model": "minilm", "trials": await measure(trials, args.runs)}
    finally:
        await engine.close()


async def bench_splade(texts: list[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    tokenizer, _, _ = model_directory("minilm", work, args.tiny, args.device)
    splade = work / "splade"
    build_splade(args.splade_shape, splade, tokenizer, texts, args.splade_nonzeros, args.tiny,
                 args.device)  # fmt: skip
    engine = await open_engine(splade, "splade", 512, args.devices, args.max_batch_tokens,
                               name="splade")  # fmt: skip
    encoder = await open_engine(splade, "cls", 512, args.devices, args.max_batch_tokens,
                                name="splade encoder")  # fmt: skip
    try:
        sample = await engine.embed(texts[:256], EmbedOptions(outputs=("sparse",)))
        assert sample.sparse is not None
        trials = {
            "float": _encoded(encoder, texts, "float"),
            "sparse": _outputs(engine, texts, "sparse"),
            "sparse_top_k": _outputs(engine, texts, "sparse", top_k=args.top_k),
            "sparse_whole_rows": _whole_rows(engine, texts),
        }
        return {
            "model": f"splade ({args.splade_shape}, random weights)",
            "vocabulary": engine.dimensions,
            "nonzeros_per_text": statistics.median(len(row.indices) for row in sample.sparse),
            "top_k": args.top_k,
            "capacity": [w.replica.compactor.capacity for w in engine.workers],
            "trials": await measure(trials, args.runs),
        }
    finally:
        await engine.close()
        await encoder.close()


async def bench_m3(texts: list[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    tokenizer, _, _ = model_directory("minilm", work, args.tiny, args.device)
    directory = work / "m3"
    build_m3(args.m3_shape, directory, tokenizer, args.tiny, args.device)
    engine = await open_engine(directory, "cls", 512, args.devices, args.max_batch_tokens,
                               name="m3")  # fmt: skip
    try:
        trials = {
            "float": _encoded(engine, texts, "float"),
            "int8": _encoded(engine, texts, "int8"),
            "binary": _encoded(engine, texts, "binary"),
            "sparse": _outputs(engine, texts, "sparse"),
            "dense_sparse": _outputs(engine, texts, "dense", "sparse"),
            "colbert": _outputs(engine, texts, "colbert"),
        }
        return {"model": f"bge-m3 heads ({args.m3_shape}, random weights)",
                "trials": await measure(trials, args.runs)}  # fmt: skip
    finally:
        await engine.close()


BENCHES = {"minilm": bench_minilm, "splade": bench_splade, "m3": bench_m3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(BENCHES), default=list(BENCHES))
    parser.add_argument("--corpus", nargs="+", default=list(DEFAULT_CORPUS), help=CORPUS_HELP)
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    parser.add_argument("--limit", type=int, help="use only the first N texts")
    parser.add_argument("--devices", default=None, help="EMBEDX_DEVICES (default auto)")
    parser.add_argument("--max-batch-tokens", type=int, default=65536)
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each; the median counts")
    parser.add_argument("--splade-shape", choices=list(SHAPES)[:2], default="bert-base")
    parser.add_argument(
        "--splade-nonzeros",
        type=int,
        default=200,
        help="weights a SPLADE row has, about (0: the random model's own)",
    )
    parser.add_argument("--top-k", type=int, default=64, help="the sparse_top_k trial's top_k")
    parser.add_argument("--m3-shape", choices=list(SHAPES)[:3], default="xlm-roberta-large")
    parser.add_argument("--tiny", action="store_true", help="tiny random shapes (CPU smoke run)")
    parser.add_argument("--out")
    args = parser.parse_args()  # fmt: skip

    import torch

    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    texts = load_corpus(args.corpus, args.repeat)[: args.limit]
    result: dict[str, Any] = {
        "benchmark": "outputs",
        "corpus": {"names": args.corpus, "repeat": args.repeat, "texts": len(texts)},
        "runs": args.runs,
        "max_batch_tokens": args.max_batch_tokens,
        "environment": environment(),
    }
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            result[name] = asyncio.run(BENCHES[name](texts, args, Path(scratch)))
    write_json(result, args.out)


if __name__ == "__main__":
    main()
