"""The CUDA paths, run on a CUDA host: `pytest -m gpu`. Each has a CPU twin in CI."""

from __future__ import annotations

import base64
import contextlib
import gc
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embedx import Embedder, Reranker
from embedx.config import load_settings
from embedx.devices import discover, open_accelerator
from embedx.engine import EmbedOptions, Engine, EngineOptions, base64_rows
from embedx.engine.outputs import ENCODINGS, FLOATS, RowForm
from embedx.models.catalog import ModelSpec
from embedx.models.pooling import Pooling
from embedx.models.source import resolve
from tests.support.fakes import oom, spin_gpu, wrap
from tests.support.models import (
    NATIVE_POOLINGS,
    build_sparser_splade,
    build_tiny_causal_reranker,
    build_tiny_m3,
    build_tiny_splade,
)
from tests.support.reference import decoded, forward

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


@contextlib.asynccontextmanager
async def cuda_engine(
    directory: Path,
    devices: str = "0",
    *,
    pooling: str = "mean",
    dtype: str = "auto",
    max_seq_len: int | None = 256,
    **options: Any,
) -> AsyncIterator[Engine]:
    spec = ModelSpec(
        name=str(directory),
        source=str(directory),
        pooling=Pooling(pooling),
        dtype=dtype,
        max_seq_len=max_seq_len,
    )
    accelerators = [open_accelerator(d) for d in discover(load_settings({"devices": devices}))]
    engine = await Engine.load(
        spec, resolve(str(directory)), accelerators, EngineOptions(**options)
    )
    try:
        yield engine
    finally:
        await engine.close()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    result: np.ndarray = (a * b).sum(1)
    return result


async def test_cuda_bf16_and_fp32_match_the_cpu_reference(
    minilm_dir: Path, reference_texts: list[str], st_reference: np.ndarray
) -> None:
    async with cuda_engine(minilm_dir) as engine:
        assert engine.dtypes["cuda:0"] == "bfloat16"
        half = (await engine.embed(reference_texts)).vectors
    assert cosines(half, st_reference).min() >= 0.999
    async with cuda_engine(minilm_dir, dtype="float32") as engine:
        full = (await engine.embed(reference_texts)).vectors
    assert np.abs(full - st_reference).max() < 1e-4


async def test_base64_rows_made_on_the_gpu_are_its_float_rows_encoded(
    minilm_dir: Path, reference_texts: list[str]
) -> None:
    async with cuda_engine(minilm_dir) as engine:
        floats = (await engine.embed(reference_texts)).vectors
        encoded = (await engine.embed(reference_texts, EmbedOptions(encodings=("base64",)))).vectors
    # two runs of a batch on a GPU need not agree to the bit; a wrong encoding is far off
    assert np.abs(decoded(encoded) - floats).max() < 1e-3


@pytest.mark.parametrize("dimensions", [384, 1024, 1001])  # 0, 2 and 1 '=' a row
def test_base64_on_the_gpu_is_standard_base64(dimensions: int) -> None:
    rows = torch.randn(300, dimensions, device="cuda")
    encoded = base64_rows.encode_on_device(rows).cpu()
    expected = [base64.b64encode(row.numpy().tobytes()) for row in rows.cpu()]
    assert [row.numpy().tobytes() for row in encoded] == expected


@pytest.mark.parametrize(
    ("shape", "pooling"),
    [("bert-base", "cls"), ("xlm-roberta-large", "mean"), ("qwen3-0.6b", "last_token")],
)
async def test_flash_varlen_matches_the_float32_cpu_forward(
    tiny_models: dict[str, Path], reference_texts: list[str], shape: str, pooling: str
) -> None:
    texts = reference_texts[:64]
    expected = forward(tiny_models[shape], pooling, "native", texts)
    async with cuda_engine(tiny_models[shape], pooling=pooling, max_seq_len=64) as engine:
        got = (await engine.embed(texts)).vectors
    assert cosines(got, expected).min() >= 0.999


@pytest.mark.parametrize(("shape", "pooling"), NATIVE_POOLINGS)
async def test_small_batches_replayed_as_cuda_graphs_match_the_cpu_forward(
    tiny_models: dict[str, Path], reference_texts: list[str], shape: str, pooling: str
) -> None:
    texts = reference_texts[:24]
    expected = forward(tiny_models[shape], pooling, "native", texts)
    async with cuda_engine(
        tiny_models[shape], pooling=pooling, max_seq_len=64, cuda_graph_tokens=2048
    ) as engine:
        assert engine.replicas[0].graphs, "no graph was captured"
        one_by_one = [(await engine.embed([text])).vectors[0] for text in texts[:8]]
        together = (await engine.embed(texts)).vectors
        assert engine.workers[0].graph_batches >= 9
    assert cosines(np.stack(one_by_one), expected[:8]).min() >= 0.999
    assert cosines(together, expected).min() >= 0.999


async def test_cuda_oom_halves_the_budget_and_the_request_succeeds(
    minilm_dir: Path, reference_texts: list[str], st_reference: np.ndarray
) -> None:
    async with cuda_engine(minilm_dir, max_batch_tokens=8192) as engine:
        wrap(engine, "cuda:0", fail=lambda b, _: oom() if b.input_ids.shape[0] > 1500 else None)
        result = await engine.embed(reference_texts)
        slot = engine.workers[0].slot
        assert slot.active
        assert slot.budget <= 2048
    assert cosines(result.vectors, st_reference).min() >= 0.999


async def test_a_hung_gpu_is_quarantined_and_the_cpu_finishes(
    minilm_dir: Path, reference_texts: list[str], st_reference: np.ndarray
) -> None:
    spin_gpu(1)  # load the spin kernel now: a first launch synchronizes the device

    def hang_first(batch: Any, call: int) -> BaseException | None:
        if call == 1:
            spin_gpu(4_000_000_000)  # about 2 s busy
        return None

    async with cuda_engine(
        minilm_dir, "0,cpu", max_batch_tokens=2048, batch_timeout_s=0.5
    ) as engine:
        # The same texts once unharmed: their shapes' kernels are loaded (a first, lazy load
        # synchronizes the device, which would hold up the launch behind the hung batch).
        await engine.embed(reference_texts[:120])
        wrap(engine, "cuda:0", fail=hang_first)
        result = await engine.embed(reference_texts[:120])
        gpu = next(w.slot for w in engine.workers if w.slot.name == "cuda:0")
        assert not gpu.active
        assert "ran past" in (gpu.reason or "")
    assert cosines(result.vectors, st_reference[:120]).min() >= 0.999


async def test_a_gpu_failing_every_batch_is_quarantined_and_the_cpu_finishes(
    minilm_dir: Path, reference_texts: list[str], st_reference: np.ndarray
) -> None:
    async with cuda_engine(minilm_dir, "0,cpu", max_batch_tokens=2048) as engine:
        wrap(engine, "cuda:0", fail=lambda b, n: RuntimeError("CUDA error: device lost (injected)"))
        result = await engine.embed(reference_texts)
        described = {d["device"]: d for d in engine.describe()["devices"]}
    assert described["cuda:0"]["state"] == "quarantined"
    assert "injected" in (described["cuda:0"]["reason"] or "")
    assert described["cpu"]["tokens"] >= result.tokens  # the CPU ran every text
    assert cosines(result.vectors, st_reference).min() >= 0.999


async def test_a_fault_in_a_graph_replay_quarantines_the_gpu_as_an_eager_batchs_would(
    minilm_dir: Path, reference_texts: list[str], st_reference: np.ndarray
) -> None:
    texts = reference_texts[:40]  # short: their batches replay the graphs captured at load
    async with cuda_engine(
        minilm_dir, "0,cpu", max_batch_tokens=2048, cuda_graph_tokens=2048
    ) as engine:
        gpu = next(r for r in engine.replicas if r.accelerator.info.label == "cuda:0")
        assert gpu.graphs, "no graph was captured"
        replays = 0

        def failing_replay(host: Any) -> torch.Tensor:
            nonlocal replays
            replays += 1
            raise RuntimeError("CUDA error: device lost (injected in a replay)")

        gpu.graphs.replay = failing_replay  # type: ignore[method-assign]
        result = await engine.embed(texts)
        described = {d["device"]: d for d in engine.describe()["devices"]}
    assert replays >= 1
    assert described["cuda:0"]["state"] == "quarantined"
    assert "injected in a replay" in (described["cuda:0"]["reason"] or "")
    assert cosines(result.vectors, st_reference[:40]).min() >= 0.999


async def test_gpu_and_cpu_together_return_correct_vectors(
    minilm_dir: Path, reference_texts: list[str], st_reference: np.ndarray
) -> None:
    async with cuda_engine(minilm_dir, "0,cpu") as engine:
        result = await engine.embed(reference_texts * 4)
        shares = {w.slot.name: w.slot.tokens_done for w in engine.workers}
    assert cosines(result.vectors, np.tile(st_reference, (4, 1))).min() >= 0.999
    assert shares["cuda:0"] > 0


def rel_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).norm() / expected.float().norm())


@pytest.mark.parametrize("width", [384, 768, 1024])
def test_triton_norms_and_silu_match_torch(width: int) -> None:
    from embedx.models.fused import TorchOps, fused_ops

    ops, reference = fused_ops(torch.device("cuda"), torch.bfloat16), TorchOps()
    assert type(ops).__name__ == "TritonOps"
    g = torch.Generator(device="cuda").manual_seed(width)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=g).bfloat16()

    x, r, w, b = rand(3001, width), rand(3001, width), rand(width), rand(width)
    xf, rf, wf, bf = (t.float() for t in (x, r, w, b))
    expected = reference.add_layer_norm(xf, rf, wf, bf, 1e-12)
    assert rel_error(ops.add_layer_norm(x, r, w, b, 1e-12), expected) < 1e-2
    total, normed = ops.add_rms_norm(x, r, w, 1e-6)
    ref_total, ref_normed = reference.add_rms_norm(xf, rf, wf, 1e-6)
    assert rel_error(total, ref_total) < 1e-2
    assert rel_error(normed, ref_normed) < 1e-2
    gate_up = rand(3001, 2 * width)
    assert rel_error(ops.silu_mul(gate_up), reference.silu_mul(gate_up.float())) < 1e-2


@pytest.mark.parametrize(("q_heads", "k_heads", "dim"), [(16, 8, 128), (4, 2, 16), (14, 2, 64)])
def test_triton_head_norm_rope_matches_torch(q_heads: int, k_heads: int, dim: int) -> None:
    from embedx.models.fused import TorchOps, fused_ops

    ops, reference = fused_ops(torch.device("cuda"), torch.bfloat16), TorchOps()
    g = torch.Generator(device="cuda").manual_seed(dim)
    tokens = 777
    width = (q_heads + 2 * k_heads) * dim
    qkv = torch.randn(tokens, width, device="cuda", generator=g).bfloat16()
    qw = torch.rand(dim, device="cuda", generator=g).bfloat16() + 0.5
    kw = torch.rand(dim, device="cuda", generator=g).bfloat16() + 0.5
    positions = torch.randint(0, 300, (tokens,), device="cuda", generator=g, dtype=torch.int32)
    angles = torch.outer(
        torch.arange(512, device="cuda").float(), torch.rand(dim // 2, device="cuda")
    )
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    q, k = ops.qk_norm_rope(qkv, q_heads, k_heads, qw, kw, positions, cos, sin, 1e-6)
    rq, rk = reference.qk_norm_rope(
        qkv.float(),
        q_heads,
        k_heads,
        qw.float(),
        kw.float(),
        positions.long(),
        cos.float(),
        sin.float(),
        1e-6,
    )
    assert q.is_contiguous()
    assert rel_error(q, rq) < 1e-2
    assert rel_error(k, rk) < 1e-2


@pytest.mark.parametrize("graph_tokens", [0, 2048])
@pytest.mark.parametrize(
    ("shape", "pooling"), [("bert-base", "mean"), ("qwen3-0.6b", "last_token")]
)
async def test_launching_a_batch_never_waits_on_the_device(
    minilm_dir: Path, tiny_models: dict[str, Path], shape: str, pooling: str, graph_tokens: int
) -> None:
    """Two batches stay in flight only if launching one never synchronizes with the GPU,
    eager or replayed as a CUDA graph."""
    async with cuda_engine(
        tiny_models[shape], pooling=pooling, max_seq_len=64, cuda_graph_tokens=graph_tokens
    ) as engine:
        await engine.embed(["warm up every kernel and buffer"] * 64)
        replica = engine.replicas[0]
        ids = [np.array([101, 2000 + i, 2001, 102], np.int32) for i in range(50)]
        host = replica.pack(ids, 1, engine.workers[0].slot.budget)
        assert (host.graph is not None) == bool(graph_tokens)  # 200 tokens: a graph's shape
        for form in (FLOATS, RowForm(unit=True, encodings=tuple(ENCODINGS))):
            torch.cuda.set_sync_debug_mode("error")
            try:
                launched = replica.accelerator.launch(partial(replica.run, host, 1, form))
            finally:
                torch.cuda.set_sync_debug_mode("default")
            await replica.accelerator.result(launched, 10.0)


async def test_evicting_a_model_gives_its_gpu_memory_back(minilm_dir: Path) -> None:
    from embedx.models.catalog import load_catalog
    from embedx.registry import LoadRequest, ModelRegistry

    settings = load_settings({"devices": "0", "smoke_test_on_load": "false"})
    request = LoadRequest(pooling="mean", keep_alive_s=0)
    leftover: list[int] = []
    for _ in range(3):  # the first load also makes what a process keeps (its CUDA stream's)
        registry = ModelRegistry(settings, load_catalog(None), discover(settings), open_accelerator)
        gc.collect()  # what earlier tests left to the collector is not this model's
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(0)
        async with registry.lease(str(minilm_dir), request) as engine:
            await engine.embed(["resident for a moment"])
            assert torch.cuda.memory_allocated(0) > before + 20 * 2**20  # weights and buffers
        await registry.drain(5)
        torch.cuda.synchronize()  # no gc.collect(): eviction itself must let go of the memory
        leftover.append(torch.cuda.memory_allocated(0) - before)
    assert max(leftover[1:]) <= 2**20, leftover


async def test_two_names_over_one_source_allocate_its_weights_once(minilm_dir: Path) -> None:
    from embedx.models.catalog import load_catalog
    from embedx.registry import ModelRegistry

    settings = load_settings({"devices": "0", "smoke_test_on_load": "false"})
    catalog = load_catalog(None)
    for name in ("search", "classify"):  # one source, as an instruct model's tasks are
        catalog[name] = ModelSpec(name=name, source=str(minilm_dir), pooling=Pooling.MEAN)
    registry = ModelRegistry(settings, catalog, discover(settings), open_accelerator)
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    async with registry.lease("search"):
        torch.cuda.synchronize()
        first = torch.cuda.memory_allocated(0)
        async with registry.lease("classify"):
            torch.cuda.synchronize()
            second = torch.cuda.memory_allocated(0)
    await registry.drain(5)
    assert first > before + 20 * 2**20  # MiniLM's weights and buffers
    assert second - first < 2**20, "the second name allocated a copy of its own"


@pytest.mark.parametrize("name", ["bert-1", "xlm-roberta-3"])
async def test_a_scorer_on_the_gpu_scores_as_cross_encoder_does(
    tiny_classifiers: dict[str, Path], reference_texts: list[str], name: str
) -> None:
    """The packed classifier head with flash attention and each pair's token types on the
    device: float32 equal to CrossEncoder's float32 scores, bfloat16 close to them."""
    from sentence_transformers import CrossEncoder

    from embedx.engine import ScoreOptions

    directory = tiny_classifiers[name]
    long = " ".join(reference_texts[:60])
    pairs = [(reference_texts[i], reference_texts[i + 1]) for i in range(0, 60, 2)]
    pairs += [(long, reference_texts[0]), (reference_texts[1], long)]
    reference = CrossEncoder(str(directory), device="cpu")
    logits = reference.predict(pairs, activation_fn=torch.nn.Identity()).reshape(len(pairs), -1)
    for dtype, tolerance in (("float32", 1e-4), ("bfloat16", 5e-2)):
        async with cuda_engine(directory, dtype=dtype, max_seq_len=None) as engine:
            raw = (await engine.score(pairs, ScoreOptions(raw=True))).scores
        assert np.abs(raw - logits).max() < tolerance, dtype


def test_splade_rows_cut_on_the_gpu_equal_sparse_encoders(
    tmp_path: Path, reference_texts: list[str]
) -> None:
    """The device's cut (compact_rows.py): each row's non-zeros, exact, in float32."""
    from sentence_transformers import SparseEncoder

    splade = build_tiny_splade(tmp_path / "splade", reference_texts)
    sparser = build_sparser_splade(splade["max-relu"], tmp_path / "sparser")
    texts = [*reference_texts[:40], "a", "the the the"]
    encoded = SparseEncoder(str(sparser), device="cpu").encode(texts, convert_to_tensor=True)
    expected = encoded.to_dense().numpy()
    with Embedder(sparser, dtype="float32", devices="0") as embedder:
        rows = embedder.embed_sparse(texts)
        pruned = embedder.embed_sparse(texts, top_k=4)
    got = np.zeros_like(expected)
    for i, row in enumerate(rows):
        got[i, row.indices] = row.values
    assert np.abs(got - expected).max() < 1e-4
    counts = np.count_nonzero(expected, axis=1)
    assert [len(row.indices) for row in pruned] == np.minimum(counts, 4).tolist()


def test_bge_m3_outputs_merged_on_the_gpu_equal_the_cpus(
    tmp_path: Path, reference_texts: list[str]
) -> None:
    """BGE-M3's sparse weights merged and ColBERT vectors cut and normalized on the device
    (models/m3.py), in float32: the CPU's, which test_m3.py holds to BGEM3FlagModel's."""
    from embedx.models.m3 import convert_heads

    directory = build_tiny_m3(tmp_path, reference_texts)
    convert_heads(directory)
    texts = [*reference_texts[:40], "a", "the the the"]
    found = {}
    for devices in ("cpu", "0"):
        with Embedder(directory, pooling="cls", dtype="float32", devices=devices) as embedder:
            found[devices] = (embedder.embed_outputs(texts),
                              embedder.embed_sparse(texts, top_k=3))  # fmt: skip
    (cpu, cpu_top), (gpu, gpu_top) = found["cpu"], found["0"]
    assert np.abs(gpu["dense"] - cpu["dense"]).max() < 1e-4
    for rows in ((gpu["sparse"], cpu["sparse"]), (gpu_top, cpu_top)):
        for got, want in zip(*rows, strict=True):
            assert got.indices.tolist() == want.indices.tolist()
            assert np.abs(got.values - want.values).max(initial=0) < 1e-4
    for got, want in zip(gpu["colbert"], cpu["colbert"], strict=True):
        assert got.shape == want.shape
        assert np.abs(got - want).max() < 1e-4


def test_a_causal_lm_reranker_on_the_gpu_scores_as_cross_encoder_does(
    tmp_path: Path, reference_texts: list[str]
) -> None:
    """Qwen3-Reranker's shape on the packed Qwen3 code with flash attention: its yes/no
    logits' scores, float32 equal to CrossEncoder's."""
    from sentence_transformers import CrossEncoder

    directory = build_tiny_causal_reranker(tmp_path, reference_texts)
    long = " ".join(reference_texts[:30])
    pairs = [(reference_texts[0], doc) for doc in reference_texts[1:20]] + [(long, long)]
    expected = CrossEncoder(str(directory), device="cpu").predict(pairs)
    with Reranker(directory, dtype="float32", devices="0") as reranker:
        scores = reranker.predict(pairs)
    assert np.abs(np.asarray(scores) - expected).max() < 1e-4
