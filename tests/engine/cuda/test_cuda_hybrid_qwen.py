"""Qwen3.5, Qwen3.5-MoE and Qwen3-Next (Gated DeltaNet hybrids) on CUDA against the numpy backend.

The models are the hybrid fixtures' (tests/fixtures/hybrid/<family>: their tensor names, config and
layer kinds) widened to shapes the CUDA kernels take: attention heads of 64 dims (the attention kernels
take 64, 128 and 256; partial RoPE turns 16 of them), a hidden size and expert widths of whole 32-weight
units (the grouped MoE kernels), 32-dim delta-rule heads. Weights are drawn here as
tests/fixtures/make_qwen35_reference.py draws them, written as an HF folder, then as llama.cpp's GGUF
(tests/engine/hybrid_gguf.py). Both backends run the engine: a 72-token prompt in 16-token prefill
chunks (the varlen conv and delta-rule kernels continuing their states), then decode (their decode
entries), alone and in a batch of eight prompts of different lengths.

Tolerances are those of test_cuda_engine.py: greedy tokens equal the numpy backend's wherever its top
two log-probs are not a near-tie (assert_greedy_agrees), the first step's top log-probs within 5e-2
(cuBLAS float16 products above a few tokens). Marked gpu: skipped without one; nothing here can hang
(fixed token counts, ignore_eos).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cuda_samples import assert_greedy_agrees, rel_err, varlen_meta

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/engine: hybrid_gguf
from hybrid_gguf import hf_weights, write_qwen_gguf  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hybrid"
FAMILIES = ("qwen35", "qwen35moe", "qwen3next")
WIDER = dict(head_dim=64, hidden_size=64, linear_key_head_dim=32, linear_value_head_dim=32,
             moe_intermediate_size=32, shared_expert_intermediate_size=32, intermediate_size=64)  # fmt: skip
PROMPT = [int(t) for t in np.random.default_rng(34).integers(0, 160, 72)]  # 72 tokens: 5 chunks of 16
STEPS = 10
LOGPROB_TOL = 5e-2


def _shape(name: str, cfg: dict[str, Any]) -> tuple[int, ...]:
    """The shape of HF tensor `name` under config `cfg` (the three families' names)."""
    h, hd, nh, kv = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, k = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    conv = 2 * hk * dk + hv * dv
    e, f, s = cfg.get("num_experts"), cfg.get("moe_intermediate_size"), cfg.get("shared_expert_intermediate_size")
    table = {
        "embed_tokens.weight": (cfg["vocab_size"], h), "lm_head.weight": (cfg["vocab_size"], h),
        "layernorm.weight": (h,), "model.norm.weight": (h,),
        "linear_attn.A_log": (hv,), "linear_attn.dt_bias": (hv,), "linear_attn.conv1d.weight": (conv, 1, k),
        "linear_attn.norm.weight": (dv,), "linear_attn.out_proj.weight": (h, hv * dv),
        "in_proj_qkv.weight": (conv, h), "in_proj_z.weight": (hv * dv, h), "in_proj_a.weight": (hv, h),
        "in_proj_b.weight": (hv, h), "in_proj_qkvz.weight": (conv + hv * dv, h), "in_proj_ba.weight": (2 * hv, h),
        "q_proj.weight": (2 * nh * hd, h), "k_proj.weight": (kv * hd, h), "v_proj.weight": (kv * hd, h),
        "o_proj.weight": (h, nh * hd), "q_norm.weight": (hd,), "k_norm.weight": (hd,),
        "experts.gate_up_proj": (e, 2 * (f or 0), h), "experts.down_proj": (e, h, f),
        "mlp.gate.weight": (e, h), "shared_expert_gate.weight": (1, h),
    }  # fmt: skip
    for suffix, shape in table.items():
        if name.endswith(suffix):
            return shape
    width = s if ".shared_expert." in name else f if ".experts." in name else cfg.get("intermediate_size")
    if name.endswith(("gate_proj.weight", "up_proj.weight")):
        return (width, h)
    if name.endswith("down_proj.weight"):
        return (h, width)
    raise AssertionError(f"no shape rule for {name}")


def _draw(name: str, shape: tuple[int, ...], cfg: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """make_qwen35_reference.build_random_model's scales: activations O(1), the decay as released models."""
    noise = rng.standard_normal(shape)
    if name.endswith("linear_attn.norm.weight"):
        return 1.0 + 0.3 * noise
    if name.endswith("norm.weight"):
        return 0.3 * noise  # zero-centred: (1 + w)
    if name.endswith("dt_bias"):
        return np.ones(shape)
    if name.endswith("A_log"):
        return np.log(rng.uniform(0.01, 16, shape))
    if "embed_tokens" in name:
        return noise * (0.3 if cfg.get("tie_word_embeddings") else 1.0)
    return noise / math.sqrt(shape[-1])  # projections N(0, 1/fan_in); conv [C, 1, K] by its K taps


@functools.cache
def wider_gguf(fam: str, folder: str) -> str:
    """The family's fixture widened (WIDER), as an HF folder and then a GGUF under `folder`."""
    from safetensors.numpy import save_file

    config = json.loads((FIXTURES / fam / "hf" / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config", config)
    text.update({k: v for k, v in WIDER.items() if k in text})
    names = sorted(hf_weights(FIXTURES / fam / "hf")[1])
    rng = np.random.default_rng(FAMILIES.index(fam) + 7)
    tensors = {n: _draw(n, _shape(n, text), text, rng).astype(np.float32) for n in names}
    hf = Path(folder) / f"{fam}-hf"
    hf.mkdir(parents=True, exist_ok=True)
    (hf / "config.json").write_text(json.dumps(config), encoding="utf-8")
    save_file(tensors, str(hf / "model.safetensors"))
    return str(write_qwen_gguf(hf, fam, Path(folder) / f"{fam}.gguf"))


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("hybrid-cuda"))


def _engine(path: str, device: str) -> Any:
    """An engine of 16-token prefill steps (prompts in chunks), no prefix cache, no graphs."""
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine

    engine = LLMEngine(EngineConfig(
        model=path, device=device, cpu_kernels="numpy", max_model_len=256, max_num_seqs=8,
        max_num_batched_tokens=16, kv_cache_bytes=8 << 20, enable_prefix_caching=False, cuda_graphs=False,
    ))  # fmt: skip
    assert engine.model_config.is_hybrid
    return engine


def _generate(engine: Any, prompts: list[list[int]]) -> list[dict]:
    from app.engine.sampling_params import SamplingParams

    return engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=5))


def _assert_matches(got: dict, ref: dict, label: str) -> None:
    """The first step's top-5 log-probs (comparable even past a near-tie split) and the greedy tokens. A
    reference token missing from the GPU's top 5 must sit within the tolerance of its 5th (a near-tie at
    the edge of the list: these random tiny models' log-probs are close together)."""
    top = dict(got["logprobs"][0].top)
    for token, value in ref["logprobs"][0].top:
        if token in top:
            assert abs(top[token] - value) < LOGPROB_TOL, f"{label}: token {token}"
        else:
            assert value < min(top.values()) + LOGPROB_TOL, f"{label}: token {token} left the top 5"
    assert_greedy_agrees(got, ref, label)


@pytest.mark.parametrize("fam", FAMILIES)
def test_cuda_greedy_and_top5_match_numpy(cuda, fam: str, tmp_root: str) -> None:
    """The 72-token prompt in 16-token prefill chunks, then decode: numpy's greedy tokens and top-5."""
    path = wider_gguf(fam, tmp_root)
    (ref,) = _generate(_engine(path, "cpu"), [PROMPT])
    (got,) = _generate(_engine(path, "cuda"), [PROMPT])
    assert len(got["token_ids"]) == STEPS
    _assert_matches(got, ref, fam)


@pytest.mark.parametrize("fam", FAMILIES)
def test_cuda_batch_of_eight_matches_each_alone_and_numpy(cuda, fam: str, tmp_root: str) -> None:
    """Eight prompts of different lengths share prefill steps (the varlen kernels over several sequences,
    some continuing their state, some starting) and decode steps: each gets the tokens it gets alone on
    CUDA, and numpy's."""
    path = wider_gguf(fam, tmp_root)
    prompts = [PROMPT[i : i + n] for i, n in enumerate((7, 70, 20, 33, 12, 58, 41, 26))]
    engine = _engine(path, "cuda")
    together = _generate(engine, prompts)
    alone = [_generate(engine, [p])[0] for p in prompts]
    reference = _generate(_engine(path, "cpu"), prompts)
    for i, (got, one, ref) in enumerate(zip(together, alone, reference, strict=True)):
        assert_greedy_agrees(got, one, f"{fam} prompt {i}: batch vs alone")
        _assert_matches(got, ref, f"{fam} prompt {i}: CUDA vs numpy")


# -- the ops alone, at the released models' head sizes --------------------------------------------------


def _on_device(cuda, meta):
    """`meta` with its device arrays on the GPU (host copies kept), as the runner makes it."""
    return dataclasses.replace(
        meta, query_start_loc=cuda.from_host(meta.query_start_loc), state_slots=cuda.from_host(meta.state_slots),
        has_initial_state=cuda.from_host(meta.has_initial_state),
    )  # fmt: skip


@pytest.mark.parametrize("lengths", [[9, 1, 70, 3], [2, 1, 2], [1] * 5], ids=["prefill", "short", "decode"])
def test_cuda_gated_deltanet_ops_match_numpy(cuda, cpu, rng, lengths: list[int]) -> None:
    """causal_conv1d, gated_delta_net_rule and gated_rms_norm (apart, and as gated_delta_net_mixer) on CUDA
    against the numpy backend's, with Qwen3-Next's 128 x 128 heads (tiled value heads, two per k head): a
    varlen prefill batch (sequences continuing their rows, starting from zeros, one of 70 tokens: the conv's
    two 64-token blocks, the delta rule's chunked kernel over five rounds), a batch of short chunks (the
    token-by-token kernel) or a decode batch (the kernels' decode entries; the mixer's one launch), states
    compared too."""
    from app.engine.specs import GatedDeltaNetSpec

    spec = GatedDeltaNetSpec(2, 4, 128, 128, 4, tiled_v_heads=True)
    initial = [True, False, True, True, False][: len(lengths)]
    meta = varlen_meta(lengths, list(rng.permutation(8)[: len(lengths)]), initial)
    n, conv, value, hv = sum(lengths), spec.conv_dim, spec.num_v_heads * spec.head_v_dim, spec.num_v_heads
    proj = rng.standard_normal((n, conv + value + 2 * hv)).astype(np.float32)
    weight = (rng.standard_normal((conv, 4)) * 0.5).astype(np.float32)
    neg_a = -np.exp(rng.uniform(-2, 1, hv)).astype(np.float32)
    dt_bias, norm_w = (rng.standard_normal(s).astype(np.float32) for s in (hv, spec.head_v_dim))
    conv_state = rng.standard_normal((8, *spec.state_shapes()[0])).astype(np.float32)
    state = (rng.standard_normal((8, *spec.state_shapes()[1])) * 0.3).astype(np.float32)
    d_proj, d_conv_state, d_state = (cuda.from_host(a) for a in (proj, conv_state, state))
    conv_state_before = conv_state.copy()
    dmeta = _on_device(cuda, meta)

    mixed = cpu.causal_conv1d(proj[:, :conv], weight, None, conv_state, meta)
    d_mixed = cuda.causal_conv1d(d_proj[:, :conv], cuda.from_host(weight), None, d_conv_state, dmeta)
    assert rel_err(cuda.to_host(d_mixed), mixed) < 1e-5
    np.testing.assert_allclose(cuda.to_host(d_conv_state), conv_state, rtol=0, atol=0)

    state_before = state.copy()
    core = cpu.gated_delta_net_rule(mixed, proj[:, conv + value :], neg_a, dt_bias, state, meta, spec)
    d_core = cuda.gated_delta_net_rule(
        d_mixed, d_proj[:, conv + value :], cuda.from_host(neg_a), cuda.from_host(dt_bias), d_state, dmeta, spec
    )
    assert rel_err(cuda.to_host(d_core), core) < 1e-4
    assert rel_err(cuda.to_host(d_state), state) < 1e-4

    out = cpu.gated_rms_norm(core, proj[:, conv : conv + value], norm_w, 1e-6)
    d_out = cuda.gated_rms_norm(d_core, d_proj[:, conv : conv + value], cuda.from_host(norm_w), 1e-6)
    assert rel_err(cuda.to_host(d_out), out) < 1e-4

    # The three as one op (one launch at decode) from the same inputs and states as above.
    d_conv_state2, d_state2 = cuda.from_host(conv_state_before), cuda.from_host(state_before)
    d_fused = cuda.gated_delta_net_mixer(
        d_proj[:, :conv], cuda.from_host(weight), d_conv_state2, d_proj[:, conv + value :], cuda.from_host(neg_a),
        cuda.from_host(dt_bias), d_state2, dmeta, spec, d_proj[:, conv : conv + value], cuda.from_host(norm_w), 1e-6,
    )  # fmt: skip
    assert rel_err(cuda.to_host(d_fused), out) < 1e-4
    assert rel_err(cuda.to_host(d_state2), state) < 1e-4
    np.testing.assert_allclose(cuda.to_host(d_conv_state2), conv_state, rtol=0, atol=0)


@pytest.mark.parametrize("interleaved", [False, True])
def test_cuda_partial_rope_matches_numpy(cuda, cpu, rng, interleaved: bool) -> None:
    """Qwen3.5's partial RoPE (64 of 256 dims) through rope.cu and rope_cache.cu (with QK-norm), against numpy."""
    n_tok, n_heads, n_kv, head_dim, rotary, max_pos, block = 6, 4, 2, 256, 64, 100, 16
    angles = np.arange(max_pos)[:, None] * (1.0 / (1e7 ** (np.arange(0, rotary, 2) / rotary)))[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    table, d_table = cpu.rope_table(cos, sin), cuda.rope_table(cos, sin)
    pos = rng.integers(0, max_pos, n_tok).astype(np.int32)
    x = rng.standard_normal((n_tok, n_heads, head_dim)).astype(np.float32)
    got = cuda.to_host(cuda.rope(cuda.from_host(x), cuda.from_host(pos), d_table, interleaved))
    assert rel_err(got, cpu.rope(x, pos, table, interleaved)) < 1e-5

    qkv = rng.standard_normal((n_tok, (n_heads + 2 * n_kv) * head_dim)).astype(np.float32)
    qn, kn = (rng.standard_normal(head_dim).astype(np.float32) for _ in range(2))
    slots = rng.choice(4 * block, n_tok, replace=False).astype(np.int32)
    k_ref, v_ref = cpu.alloc_kv_cache(4, block, n_kv, head_dim)
    q_ref = cpu.rope_and_cache(qkv, n_heads, n_kv, head_dim, qn, kn, 1e-6, pos, table, interleaved, k_ref, v_ref, slots)
    k_dev, v_dev = cuda.alloc_kv_cache(4, block, n_kv, head_dim)
    q = cuda.rope_and_cache(
        cuda.from_host(qkv), n_heads, n_kv, head_dim, cuda.from_host(qn), cuda.from_host(kn), 1e-6,
        cuda.from_host(pos), d_table, interleaved, k_dev, v_dev, cuda.from_host(slots),
    )  # fmt: skip
    assert rel_err(cuda.to_host(q), q_ref) < 1e-5
    k_got = cuda.to_host(k_dev).astype(np.float32).reshape(-1, n_kv, head_dim)[slots]
    np.testing.assert_allclose(k_got, k_ref.reshape(-1, n_kv, head_dim)[slots], rtol=2e-3, atol=2e-3)


def test_cuda_causal_conv1d_with_bias_matches_numpy(cuda, cpu, rng) -> None:
    """The conv as Mamba-2 calls it (a bias, SiLU) over a prompt of 150 rows (three 64-token blocks, the
    later ones reading their window from x) beside a sequence shorter than K-1 and a padding row
    (slot -1: zeros out, no state row touched)."""
    channels, k = 300, 4
    meta = varlen_meta([150, 2, 1], [3, 0, 5], [True, True, False])
    x = rng.standard_normal((153, channels)).astype(np.float32)
    weight, bias = (rng.standard_normal(s).astype(np.float32) for s in ((channels, k), channels))
    state = rng.standard_normal((6, channels, k - 1)).astype(np.float32)
    d_state = cuda.from_host(state)
    dmeta = _on_device(cuda, dataclasses.replace(meta, state_slots=np.array([3, 0, -1], np.int32)))
    got = cuda.to_host(cuda.causal_conv1d(cuda.from_host(x), cuda.from_host(weight), cuda.from_host(bias), d_state,
                                          dmeta))  # fmt: skip
    ref_state = state.copy()
    ref = cpu.causal_conv1d(x, weight, bias, ref_state, meta)
    assert rel_err(got[:152], ref[:152]) < 1e-5
    np.testing.assert_array_equal(got[152], 0.0)
    got_state = cuda.to_host(d_state)
    np.testing.assert_array_equal(got_state[[3, 0]], ref_state[[3, 0]])
    np.testing.assert_array_equal(got_state[[1, 2, 4, 5]], state[[1, 2, 4, 5]])  # slot 5: the padding row's


@pytest.mark.parametrize("mixer", [False, True], ids=["three-ops", "mixer"])
def test_cuda_gated_deltanet_decode_step_replays_as_a_graph(cuda, rng, mixer: bool) -> None:
    """The layer's decode ops (conv, delta rule, gated norm; or gated_delta_net_mixer's one launch, whose
    counters must be back at zero for the next replay) captured in a CUDA graph with programmatic launches,
    as the decode graphs capture a step: no host sync breaks the capture, and replays after new inputs,
    state slots and flags are written into the captured buffers (one row now padding, slot -1) give what an
    eager run of the three ops gives on copies of the same states."""
    import cupy

    from app.engine.kernels.runtime.pdl import programmatic_launches
    from app.engine.specs import GatedDeltaNetSpec

    spec = GatedDeltaNetSpec(2, 4, 128, 128, 4, tiled_v_heads=False)
    n, conv, value, hv = 4, spec.conv_dim, spec.num_v_heads * spec.head_v_dim, spec.num_v_heads
    meta = _on_device(cuda, varlen_meta([1] * n, [0, 1, 2, 3], [True] * n))
    proj = cuda.from_host(rng.standard_normal((n, conv + value + 2 * hv)).astype(np.float32))
    weight = cuda.from_host((rng.standard_normal((conv, 4)) * 0.5).astype(np.float32))
    neg_a = cuda.from_host(-np.exp(rng.uniform(-2, 1, hv)).astype(np.float32))
    dt_bias, norm_w = (cuda.from_host(rng.standard_normal(s).astype(np.float32)) for s in (hv, spec.head_v_dim))
    conv_state = cuda.from_host(rng.standard_normal((6, *spec.state_shapes()[0])).astype(np.float32))
    state = cuda.from_host((rng.standard_normal((6, *spec.state_shapes()[1])) * 0.3).astype(np.float32))

    def three_ops(states: tuple[Any, Any]) -> Any:
        mixed = cuda.causal_conv1d(proj[:, :conv], weight, None, states[0], meta)
        core = cuda.gated_delta_net_rule(mixed, proj[:, conv + value :], neg_a, dt_bias, states[1], meta, spec)
        return cuda.gated_rms_norm(core, proj[:, conv : conv + value], norm_w, 1e-6)

    def one_op(states: tuple[Any, Any]) -> Any:
        return cuda.gated_delta_net_mixer(
            proj[:, :conv], weight, states[0], proj[:, conv + value :], neg_a, dt_bias, states[1], meta, spec,
            proj[:, conv : conv + value], norm_w, 1e-6,
        )  # fmt: skip

    step = one_op if mixer else three_ops
    tol = 1e-5 if mixer else 1e-6  # the fused kernel against the three: the same math, other code
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream, programmatic_launches(True):
        step((conv_state.copy(), state.copy()))  # warm-up: compiles the kernels, sizes the pool's blocks
        stream.synchronize()
        stream.begin_capture()
        out = step((conv_state, state))
        graph = stream.end_capture()
    for replay in range(2):  # the second replay starts from the first one's states and counters
        proj[...] = cuda.from_host(rng.standard_normal(proj.shape).astype(np.float32))
        meta.state_slots[...] = cuda.from_host(np.array([5, -1, 1, 4], np.int32))
        meta.has_initial_state[...] = cuda.from_host(np.array([True, True, replay == 1, True]))
        eager_states = (conv_state.copy(), state.copy())
        cupy.cuda.Device().synchronize()
        graph.launch(stream=cupy.cuda.Stream.null)
        cupy.cuda.Stream.null.synchronize()
        eager = three_ops(eager_states)
        np.testing.assert_allclose(cuda.to_host(out), cuda.to_host(eager), rtol=tol, atol=tol)
        np.testing.assert_array_equal(cuda.to_host(out)[1], 0.0)  # the padding row
        for got, want in zip((conv_state, state), eager_states, strict=True):
            np.testing.assert_allclose(cuda.to_host(got), cuda.to_host(want), rtol=tol, atol=tol)
