"""`--experts-on-gpu N` on CUDA: experts in pinned host RAM, a hot set and staging slots on the GPU
(backend/cuda/experts.py: StreamedExperts), against every expert resident on the same GPU.

GPU tests (marked `gpu`, skipped without one): a layer with per-expert K-quant experts at 1, 9
and 70 tokens (70 tokens pick every expert, so with 2 staging slots the step runs in rounds),
called twice so the second call finds last call's picks staged; the tiny Qwen3-MoE GGUF in every
run mode of the paged-KV harness; the engine's greedy tokens with decode graphs off. Streaming
adds the hot and cold passes' partial sums, so results match to float32 rounding, not bit for
bit (at 1-4 tokens, to int16 x's rounding: the resident layer's few-tokens path reads float32 x). The refusal of experts the kernels cannot stream runs everywhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cuda_samples import GATED_FACTOR, INT_X_TOL, backend_int_x, random_tensor, rel_err

from app.engine.backend.cuda.backend import CudaBackend
from app.engine.kernels import moe as moe_kernels
from app.engine.layers.moe import MoE
from app.engine.models.config import MoeSpec
from app.engine.moe.residency import ExpertStreaming
from app.engine.quant.dispatch import QuantizedTensor, ScaleGrid
from app.engine.quant.types import QUANT_TYPES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/engine: model_harness
from model_harness import MODES, run_logits

FAMILIES = Path(__file__).resolve().parents[2] / "fixtures" / "families"
QWEN3MOE = FAMILIES / "qwen3moe" / "qwen3moe-q8_0-q4_0.gguf"
SPEC = MoeSpec(num_experts=6, num_used=2, intermediate_size=256)
HIDDEN = 256


def _layer_tensors(qtype: str, rng: np.random.Generator) -> dict[str, QuantizedTensor]:
    p, ff = "blk.0", SPEC.intermediate_size
    router = rng.standard_normal((SPEC.num_experts, HIDDEN)).astype(np.float32) / 16
    tensors = {f"{p}.ffn_gate_inp.weight": QuantizedTensor.from_float("router", router, QUANT_TYPES["F32"])}
    for part, rows, cols in (("gate", ff, HIDDEN), ("up", ff, HIDDEN), ("down", HIDDEN, ff)):
        for e in range(SPEC.num_experts):
            tensors[f"{p}.ffn_{part}_exps.{e}.weight"] = random_tensor(qtype, rows, cols, rng, f"{part}{e}")
    return tensors


def _streaming_backend(on_gpu: int) -> CudaBackend:
    backend = CudaBackend()
    backend.expert_streaming = ExpertStreaming(on_gpu=on_gpu, rebalance_every=3)
    return backend


def test_experts_the_kernels_cannot_read_are_refused_by_name() -> None:
    """Host side: split-format experts (FP8 with a separate scale grid) cannot be streamed."""
    codes = np.zeros((SPEC.intermediate_size, HIDDEN), np.uint8)
    fp8 = QuantizedTensor("blk.0.ffn_gate_exps.0.weight", QUANT_TYPES["FP8_E4M3"], codes.shape, codes,
                          ScaleGrid(np.ones((2, 2), np.float32), "F32", (128, 128)))  # fmt: skip
    fake = SimpleNamespace(expert_streaming=ExpertStreaming(on_gpu=2))
    with pytest.raises(ValueError, match=r"--experts-on-gpu 2: .*cannot be streamed.*separate tensor.*all"):
        CudaBackend.load_experts(fake, SPEC, [[fp8] * 6] * 3, [[None] * 6] * 3)


@pytest.mark.gpu
@pytest.mark.parametrize("on_gpu", [0, 3, 6])
@pytest.mark.parametrize("n_tok", [1, 9, 70])
def test_streamed_layer_matches_the_resident_one(cuda, rng, on_gpu: int, n_tok: int) -> None:
    tensors = _layer_tensors("Q4_K", rng)
    resident = MoE(cuda, tensors, "blk.0", SPEC)
    backend = _streaming_backend(on_gpu)
    streamed = MoE(backend, tensors, "blk.0", SPEC)
    assert streamed.syncs_host and not resident.syncs_host
    # Both run the same grouped products from 5 tokens; below, the resident layer takes the few-tokens path
    # (float32 x) while the streamed passes stay grouped, over int16 x where the backend reads it.
    few = n_tok <= moe_kernels.FUSED_DECODE_MAX_TOKENS and backend_int_x()
    tol = GATED_FACTOR * INT_X_TOL if few else 1e-5
    for call in range(2):
        x = rng.standard_normal((n_tok, HIDDEN)).astype(np.float32)
        expected = cuda.to_host(resident(cuda.from_host(x)))
        got = backend.to_host(streamed(backend.from_host(x)))
        assert rel_err(got, expected) < tol, f"call {call}"
    (layer,) = backend.expert_streaming.layers
    layer.check_integrity()
    assert (layer.bytes_copied > 0) == (on_gpu < 6)
    sizes = sum(w.data.nbytes for w in (tensors[f"blk.0.ffn_{p}_exps.0.weight"] for p in ("gate", "up", "down")))
    assert layer.bytes_copied == layer.copies * sizes


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_qwen3moe_logits_with_streamed_experts_match_resident(cuda, mode: str) -> None:
    from app.engine.loader.weights import open_checkpoint
    from app.engine.models.registry import build_model

    tokens = np.random.default_rng(43).integers(0, 256, 32).tolist()
    reference = run_logits(build_model(open_checkpoint(QWEN3MOE), cuda, 64), cuda, tokens, mode)
    for on_gpu in (0, 2):
        backend = _streaming_backend(on_gpu)
        model = build_model(open_checkpoint(QWEN3MOE), backend, 64)
        assert model.syncs_host
        ours = run_logits(model, backend, tokens, mode)
        scale = max(1.0, float(np.abs(reference).max()))
        assert np.abs(ours - reference).max() < 1e-4 * scale, f"{mode} with {on_gpu} experts on the GPU"


@pytest.mark.gpu
def test_engine_streams_experts_without_decode_graphs(cuda) -> None:
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    prompts = [np.random.default_rng(n).integers(0, 256, n).tolist() for n in (3, 17, 40, 9)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2)

    def run(on_gpu):
        config = EngineConfig(model=str(QWEN3MOE), device="cuda", max_model_len=256, max_num_seqs=4,
                              experts_on_gpu=on_gpu)  # fmt: skip
        engine = LLMEngine(config)
        return engine, engine.generate(prompts, params)

    resident, reference = run(None)
    assert resident.runner.graphs is not None and resident.stats().expert_bytes_copied_total == 0
    for on_gpu in (0, 3):
        engine, results = run(on_gpu)
        assert engine.runner.graphs is None  # the router's choices are read on the host each layer
        assert engine.stats().expert_bytes_copied_total > 0
        for got, ref in zip(results, reference, strict=True):
            pairs = enumerate(zip(got["token_ids"], ref["token_ids"], strict=True))
            split = next((i for i, (a, b) in pairs if a != b), None)
            if split is not None:  # only where the resident run's top two were within rounding
                top = ref["logprobs"][split].top
                assert abs(top[0][1] - top[1][1]) < 1e-3, f"{on_gpu} on the GPU: split at {split}"
