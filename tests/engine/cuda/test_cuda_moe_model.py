"""The MoE kernels (kernels/moe.py) wired into the CUDA backend: a MoE layer's experts stacked on
the GPU and run by one `backend.moe` call, against the numpy backend's per-expert loop.

GPU tests (marked `gpu`, skipped without one): the tiny random Qwen3-MoE fixtures (GGUF Q8_0/Q4_0
experts stacked in the file; the Hugging Face folder's bf16 experts listed one by one) in every
run mode of the paged-KV harness; a layer with K-quant experts given per expert; the whole engine
with decode CUDA graphs (and with the few-tokens MoE path off, PADDOCK_MOE_FUSED_DECODE=0); the tiny GPT-OSS (head dim 16) refused on CUDA, whose attention with sinks
takes head dims 64, 128 and 256 (test_cuda_attention.py checks the sinks themselves). The host-side parts
(which experts the kernels take, the stacking, the layer's routing through `backend.moe`) run
everywhere.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from cuda_samples import backend_int_x, experts_tol, random_tensor, rel_err

from app.engine.backend.cpu import CpuBackend
from app.engine.backend.cuda.experts import stacked_biases, stacked_bytes, unsupported
from app.engine.kernels.moe import routing_supported
from app.engine.layers.moe import MoE, expert_tensors
from app.engine.models.config import MoeSpec
from app.engine.quant.dispatch import QuantizedTensor, ScaleGrid
from app.engine.quant.types import QUANT_TYPES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/engine: model_harness
from model_harness import MODES, run_logits

FAMILIES = Path(__file__).resolve().parents[2] / "fixtures" / "families"
QWEN3MOE = {"gguf": FAMILIES / "qwen3moe" / "qwen3moe-q8_0-q4_0.gguf", "hf": FAMILIES / "qwen3moe" / "hf"}
SPEC = MoeSpec(num_experts=6, num_used=2, intermediate_size=256)  # K-quant rows: whole 256-weight blocks
HIDDEN = 256


def _f32(name: str, values: np.ndarray) -> QuantizedTensor:
    return QuantizedTensor.from_float(name, values.astype(np.float32), QUANT_TYPES["F32"])


def _per_expert_layer(qtype: str, rng: np.random.Generator, spec: MoeSpec = SPEC) -> dict[str, QuantizedTensor]:
    """A layer's tensors with the experts listed one by one, as Hugging Face folders name them."""
    p, ff = "blk.0", spec.intermediate_size
    tensors = {f"{p}.ffn_gate_inp.weight": _f32("router", rng.standard_normal((spec.num_experts, HIDDEN)) / 16)}
    for part, rows, cols in (("gate", ff, HIDDEN), ("up", ff, HIDDEN), ("down", HIDDEN, ff)):
        for e in range(spec.num_experts):
            tensors[f"{p}.ffn_{part}_exps.{e}.weight"] = random_tensor(qtype, rows, cols, rng, f"{part}{e}")
    return tensors


# -- host side: what the kernels take, the stacking, the layer's call -------------------------


def test_unsupported_names_what_the_kernels_cannot_take(rng) -> None:
    tensors = _per_expert_layer("Q4_K", rng)
    gates = expert_tensors(tensors, "blk.0.ffn_gate_exps.weight", 6)
    assert unsupported(SPEC, [gates, gates, gates]) is None
    assert "gelu" in unsupported(MoeSpec(6, 2, 256, activation="gelu"), [gates])
    assert "17 experts per token" in unsupported(MoeSpec(32, 17, 256), [gates])
    mixed = [*gates[:5], random_tensor("Q8_0", SPEC.intermediate_size, HIDDEN, rng, "gate5")]
    assert "'gate5' (Q8_0" in unsupported(SPEC, [mixed])
    codes = np.zeros((64, HIDDEN), np.uint8)
    fp8 = QuantizedTensor("fp8", QUANT_TYPES["FP8_E4M3"], (64, HIDDEN), codes,
                          ScaleGrid(np.ones((1, 2), np.float32), "F32", (128, 128)))  # fmt: skip
    assert "separate tensor" in unsupported(SPEC, [[fp8] * 6])


def test_stacking_per_expert_views_gives_the_file_layout(rng) -> None:
    """Row views of a GGUF-stacked tensor, stacked again, are the file's bytes plus zero padding."""
    flat = random_tensor("Q6_K", 6 * 64, HIDDEN, rng, "gate")
    stacked = QuantizedTensor("blk.0.ffn_gate_exps.weight", flat.qtype, (6, 64, HIDDEN), flat.data)
    views = expert_tensors({stacked.name: stacked}, stacked.name, 6)
    got = stacked_bytes(views)
    assert np.array_equal(got[: flat.data.nbytes], flat.data.reshape(-1))
    assert got.nbytes == flat.data.nbytes + 16 and not got[flat.data.nbytes :].any()
    assert stacked_biases([None] * 6, 64) is None
    bias = _f32("b", np.arange(64))
    values = stacked_biases([None, bias, None, None, None, bias], 64)
    assert values.shape == (6, 64) and not values[0].any() and (values[5] == np.arange(64)).all()


class _GroupedCpu(CpuBackend):
    """numpy with the CUDA backend's two MoE ops, answered by the reference loop: what the layer
    hands them is checked, not the kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.loaded: list[str] = []

    def load_weight(self, tensor):
        self.loaded.append(tensor.name)
        return super().load_weight(tensor)

    def load_experts(self, spec, weights, biases):
        self.reference = (spec, weights, biases)
        return ("stacked", len(weights))

    def moe(self, x, router_logits, spec, experts, **scale):
        self.calls.append((x, router_logits, spec, experts, scale))
        return np.full_like(x, 3.0)


def test_layer_routes_through_backend_moe_without_per_expert_weights(rng) -> None:
    tensors = _per_expert_layer("Q8_0", rng)
    backend = _GroupedCpu()
    layer = MoE(backend, tensors, "blk.0", SPEC)
    assert backend.loaded == ["router"]  # the experts went to load_experts only
    spec, weights, _ = backend.reference
    assert spec is SPEC and [[w.name for w in ws][:2] for ws in weights] == [["gate0", "gate1"], ["up0", "up1"],
                                                                             ["down0", "down1"]]  # fmt: skip
    assert not layer.syncs_host
    x = rng.standard_normal((5, HIDDEN)).astype(np.float32)
    assert (layer(x) == 3.0).all()
    ((x_in, logits, spec_in, experts, scale),) = backend.calls
    assert x_in is x and experts == ("stacked", 3) and spec_in is SPEC and scale == {}
    assert np.allclose(logits, x @ tensors["blk.0.ffn_gate_inp.weight"].dequantize().T, rtol=1e-5, atol=1e-6)
    assert MoE(CpuBackend(), tensors, "blk.0", SPEC).syncs_host  # numpy: the per-expert loop


class _ScalingGroupedCpu(_GroupedCpu):
    moe_routing = staticmethod(routing_supported)  # as CudaBackend: moe(..., expert_scale=, score_bias=)


def test_per_expert_scales_go_to_backend_moe_only_where_it_takes_them(rng) -> None:
    """Gemma 4's learned factor per expert's output: handed to `backend.moe` on a backend that says it
    applies them (CUDA), else the layer keeps its per-expert loop (never a grouped call that drops them)."""
    tensors = _per_expert_layer("Q8_0", rng)
    factors = rng.uniform(0.5, 2.0, SPEC.num_experts).astype(np.float32)
    tensors["blk.0.ffn_down_exps.scale"] = _f32("blk.0.ffn_down_exps.scale", factors)
    backend = _ScalingGroupedCpu()
    layer = MoE(backend, tensors, "blk.0", SPEC)
    assert not layer.syncs_host
    layer(rng.standard_normal((3, HIDDEN)).astype(np.float32))
    ((*_, scale),) = backend.calls
    assert np.array_equal(scale["expert_scale"], factors)
    without = _GroupedCpu()
    assert MoE(without, tensors, "blk.0", SPEC).syncs_host and not hasattr(without, "reference")


def test_sigmoid_routing_with_its_bias_goes_to_backend_moe_where_it_is_computed(rng) -> None:
    """Laguna's router (sigmoid scores chosen with `exp_probs_b`, capped logits): its bias handed to a
    backend whose `moe_routing` takes the spec; groups the router kernel cannot split (6 experts in 4)
    stay on the per-expert loop."""
    tensors = _per_expert_layer("Q8_0", rng)
    bias = rng.standard_normal(SPEC.num_experts).astype(np.float32)
    tensors["blk.0.exp_probs_b.bias"] = _f32("blk.0.exp_probs_b.bias", bias)
    laguna = MoeSpec(6, 2, 256, routing="sigmoid_grouped", routed_scale=2.0, router_softcap=0.5)
    backend = _ScalingGroupedCpu()
    layer = MoE(backend, tensors, "blk.0", laguna)
    assert not layer.syncs_host
    layer(rng.standard_normal((2, HIDDEN)).astype(np.float32))
    ((*_, extras),) = backend.calls
    assert set(extras) == {"score_bias"} and np.array_equal(extras["score_bias"], bias)
    grouped = MoeSpec(6, 2, 256, routing="sigmoid_grouped", num_groups=2, topk_groups=1)  # Nemotron-H's groups
    assert not MoE(_ScalingGroupedCpu(), tensors, "blk.0", grouped).syncs_host
    uneven = MoeSpec(6, 2, 256, routing="sigmoid_grouped", num_groups=4, topk_groups=1)
    assert MoE(_ScalingGroupedCpu(), tensors, "blk.0", uneven).syncs_host
    assert MoE(_GroupedCpu(), tensors, "blk.0", laguna).syncs_host  # a backend that does not say


# -- on the GPU ------------------------------------------------------------------------------


def _tolerance(reference: np.ndarray) -> float:
    """float16 KV and prefill products, the kernels' summation order: 1% of the logit scale."""
    return 1e-2 * max(1.0, float(np.abs(reference).max()))


# Tokens whose every routing decision in the numpy run is at least MIN_GAP from a tie (the k-th
# and next router logits; they spread over ~2.3): the GPU's float16 prefill products move router
# logits by ~1e-3, so none of them can pick another expert here (seed chosen by a search; checked).
TOKENS = np.random.default_rng(43).integers(0, 256, 32).tolist()
MIN_GAP = 0.02


def _recording_routers(model) -> list:
    """Wrap each MoE router of `model` to keep its logits; the list they are appended to."""
    seen: list = []
    for layer in model.layers:
        router = layer.moe.router

        def record(x, router=router):
            logits = router(x)
            seen.append(np.asarray(logits))
            return logits

        layer.moe.router = record
    return seen


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("source", sorted(QWEN3MOE))
def test_qwen3moe_logits_on_cuda_match_numpy(cuda, cpu, source: str, mode: str) -> None:
    from app.engine.loader.weights import open_checkpoint
    from app.engine.models.registry import build_model

    numpy_model = build_model(open_checkpoint(QWEN3MOE[source]), cpu, 64)
    routers = _recording_routers(numpy_model)
    run_logits(numpy_model, cpu, TOKENS, "prefill")  # the routing of TOKENS alone (no companion)
    k = numpy_model.config.moe.num_used
    gaps = [np.diff(np.sort(logits, axis=-1)[:, -k - 1 : -k + 1], axis=-1).min() for logits in routers]
    assert min(gaps) > MIN_GAP, "the test's tokens route near a tie: pick others"
    reference = run_logits(numpy_model, cpu, TOKENS, mode)
    model = build_model(open_checkpoint(QWEN3MOE[source]), cuda, 64)
    assert all(layer.moe.grouped is not None for layer in model.layers)  # every layer on moe.cu
    assert not model.syncs_host
    ours = run_logits(model, cuda, TOKENS, mode)
    diff = np.abs(ours - reference).max()
    assert diff < _tolerance(reference), f"{source} {mode}: max |logit diff| {diff:.4g}"
    top2 = np.sort(reference, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * _tolerance(reference)
    assert (ours.argmax(-1) == reference.argmax(-1))[clear].all()


@pytest.mark.gpu
@pytest.mark.parametrize("n_tok", [1, 9, 70])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q5_0", "MXFP4"])
def test_layer_with_per_expert_kquants_matches_numpy(cuda, cpu, rng, qtype: str, n_tok: int) -> None:
    """The experts after the router, exactly: the numpy layer is handed the GPU router's logits
    (above 2 tokens the router's product runs in float16 on cuBLAS, which may move a near-tie)."""
    tensors = _per_expert_layer(qtype, rng)
    ours = MoE(cuda, tensors, "blk.0", SPEC)
    assert ours.grouped is not None
    x = rng.standard_normal((n_tok, HIDDEN)).astype(np.float32)
    got = cuda.to_host(ours(cuda.from_host(x)))
    reference = MoE(cpu, tensors, "blk.0", SPEC)
    logits = cuda.to_host(ours.router(cuda.from_host(x)))
    assert rel_err(logits, reference.router(x)) < 5e-3
    reference.router = lambda _: logits
    tol = experts_tol(n_tok, SPEC.num_used, SPEC.num_experts, qtype, HIDDEN, backend_int_x())
    assert rel_err(got, reference(x)) < tol


@pytest.mark.gpu
def test_engine_with_decode_graphs_matches_numpy_on_qwen3moe(cuda) -> None:
    """The MoE layers now run inside the captured decode graphs (no host sync in a step)."""
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    prompts = [np.random.default_rng(n).integers(0, 256, n).tolist() for n in (3, 17, 40, 9)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2)
    results = {}
    for device in ("cpu", "cuda"):
        config = EngineConfig(model=str(QWEN3MOE["gguf"]), device=device, max_model_len=256, max_num_seqs=4)
        engine = LLMEngine(config)
        if device == "cuda":
            assert engine.runner.graphs is not None
        results[device] = engine.generate(prompts, params)
    for got, ref in zip(results["cuda"], results["cpu"], strict=True):
        for token, value in ref["logprobs"][0].top:
            assert abs(dict(got["logprobs"][0].top).get(token, -99.0) - value) < 5e-2
        pairs = enumerate(zip(got["token_ids"], ref["token_ids"], strict=True))
        split = next((i for i, (a, b) in pairs if a != b), None)
        if split is not None:
            top = ref["logprobs"][split].top
            assert abs(top[0][1] - top[1][1]) < 5e-2, f"split at {split} without a near-tie"


@pytest.mark.gpu
def test_gpt_oss_of_head_dim_16_is_refused_on_cuda_for_its_sinks(cuda) -> None:
    from app.engine.loader.weights import open_checkpoint
    from app.engine.models.registry import build_model

    with pytest.raises(NotImplementedError, match=r"sinks takes head dims \(64, 128, 256\).* 16;.*--device cpu"):
        build_model(open_checkpoint(FAMILIES / "gpt-oss" / "gpt-oss-bf16-q8_0.gguf"), cuda, 64)


@pytest.mark.gpu
def test_decode_graphs_give_the_same_tokens_with_the_few_tokens_moe_path_off(cuda, monkeypatch) -> None:
    """Decode steps of 1 to 4 sequences run moe_few_tokens inside the captured graphs (kernels/moe.py);
    PADDOCK_MOE_FUSED_DECODE=0 puts them back on the grouped path: the same tokens, the same logprobs but
    for the last bits."""
    from app.engine import envs
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    prompts = [np.random.default_rng(n).integers(0, 256, n).tolist() for n in (5, 23, 11)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    results = {}
    for switch in ("1", "0"):
        monkeypatch.setenv("PADDOCK_MOE_FUSED_DECODE", switch)
        envs.reload()
        try:
            config = EngineConfig(model=str(QWEN3MOE["gguf"]), device="cuda", max_model_len=256, max_num_seqs=4)
            engine = LLMEngine(config)
            assert engine.runner.graphs is not None
            assert engine.runner.backend.kernel_options.moe_fused_decode is (switch == "1")
            results[switch] = engine.generate(prompts, params)
        finally:
            monkeypatch.delenv("PADDOCK_MOE_FUSED_DECODE")
            envs.reload()
    for on, off in zip(results["1"], results["0"], strict=True):
        pairs = enumerate(zip(on["token_ids"], off["token_ids"], strict=True))
        split = next((i for i, (a, b) in pairs if a != b), len(off["token_ids"]))
        for step in range(split):  # the same context up to here: the same distribution
            for token, value in off["logprobs"][step].top:
                assert abs(dict(on["logprobs"][step].top).get(token, -99.0) - value) < 1e-3
        if split < len(off["token_ids"]):
            top = off["logprobs"][split].top
            assert abs(top[0][1] - top[1][1]) < 1e-3, f"split at {split} without a near-tie"
