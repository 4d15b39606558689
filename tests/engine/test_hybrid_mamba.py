"""Nemotron-H, Nemotron-H MoE and Granite 4 hybrid (Mamba-2 hybrids) against transformers 5.24.

tests/fixtures/hybrid/<family>/ holds a tiny random-weight HF folder per family and transformers'
float32 outputs for a 72-token sequence (tests/fixtures/make_mamba_reference.py made them: its
SSD chunk is 16 tokens, so its prefill carries the state across five chunks); the GGUFs are written
here at test time in llama.cpp's layout (hybrid_gguf.py: -exp(A_log) as [H, 1], the grouped norm as
[G, d_inner / G], q/k permuted, experts stacked, Granite's gate/up rows split). At the model level
(DecoderModel.forward with hand-built metadata and state slots: test_hybrid_qwen's Runner) the
models run in one prefill, in chunked prefill (13, 11, then the rest) and decode one token at a
time (the one-step recurrence). Through the engine (`LLMEngine` in 8-token prefill steps, on the HF
folder with a tokenizer.json beside it and on the GGUF): greedy tokens and top-5 log-probs, batches
of eight against each alone, a prefix hit resuming the Mamba-2 states from a snapshot. Also: an F16
GGUF on the numba backend, a Q8_0 GGUF against its own float values, the scan's two forms against
each other, Nemotron-H's router, and the configs (both sources, the hub's spellings, refusals).

Tolerance: logits within 1e-5 x the case's logit scale, test_families.py's bound, on the numpy and
the numba backend alike (float32 summation order, the chunked against the recurrent form: measured
<= 1e-6 x scale); first-step top-5 log-probs within 1e-3.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GQ
from hybrid_gguf import write_mamba_gguf  # sibling modules: pytest puts tests/engine on sys.path
from test_hybrid_qwen import Runner, chunked_then_greedy, engine_folder, greedy_params, log_softmax

from app.engine import EngineConfig
from app.engine.backend import cpu_backend
from app.engine.backend.base import AttentionMetadata
from app.engine.backend.cpu import CpuBackend
from app.engine.backend.ssd_reference import ssd_chunked, ssd_recurrent, ssd_scan
from app.engine.core.engine import LLMEngine
from app.engine.layers.moe import route
from app.engine.loader.names import CheckpointError
from app.engine.loader.weights import open_checkpoint
from app.engine.models.config import (
    FFN_DENSE,
    FFN_MOE,
    FFN_NONE,
    MIXER_ATTENTION,
    MIXER_MAMBA2,
    MIXER_NONE,
    MoeSpec,
)
from app.engine.models.decoder import DecoderModel
from app.engine.models.registry import build_model, family, model_config
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hybrid"
ARCH = {
    "nemotron_h": "nemotron_h",
    "nemotron_h_moe": "nemotron_h_moe",
    "granite_hybrid": "granitehybrid",
    "granite_hybrid_dense": "granitehybrid",
    "nemotron_h_latent": "nemotron_h_moe",
}
FAMILIES = tuple(ARCH)
SOURCES = ("hf", "gguf")
RTOL = 1e-5  # as test_families.py: float32 summation order only
MAX_POSITIONS = 256
# config.json layer kinds -> (mixer, feed-forward), as each family's layers are built
LAYERS = {
    "nemotron_h": [(MIXER_MAMBA2, FFN_NONE), (MIXER_NONE, FFN_DENSE), (MIXER_ATTENTION, FFN_NONE),
                   (MIXER_MAMBA2, FFN_NONE), (MIXER_NONE, FFN_DENSE)],
    "nemotron_h_moe": [(MIXER_MAMBA2, FFN_NONE), (MIXER_NONE, FFN_MOE), (MIXER_ATTENTION, FFN_NONE),
                       (MIXER_MAMBA2, FFN_NONE), (MIXER_NONE, FFN_MOE)],
    "granite_hybrid": [(MIXER_MAMBA2, FFN_MOE), (MIXER_ATTENTION, FFN_MOE), (MIXER_MAMBA2, FFN_MOE)],
    "granite_hybrid_dense": [(MIXER_MAMBA2, FFN_DENSE), (MIXER_ATTENTION, FFN_DENSE), (MIXER_MAMBA2, FFN_DENSE)],
    "nemotron_h_latent": [(MIXER_MAMBA2, FFN_NONE), (MIXER_NONE, FFN_MOE), (MIXER_ATTENTION, FFN_NONE),
                          (MIXER_NONE, FFN_MOE)],
}  # fmt: skip


def manifest(fam: str) -> dict[str, Any]:
    return json.loads((FIXTURES / fam / "manifest.json").read_text(encoding="utf-8"))


def hf_config(fam: str) -> dict[str, Any]:
    return json.loads((FIXTURES / fam / "hf" / "config.json").read_text(encoding="utf-8"))


@functools.cache
def reference(fam: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / fam / "references.npz") as refs:
        return dict(refs)


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("mamba-gguf"))


@functools.cache
def gguf_path(fam: str, tmp_root: str, kind: GQ = GQ.BF16) -> Path:
    return write_mamba_gguf(
        FIXTURES / fam / "hf", ARCH[fam], Path(tmp_root) / f"{fam}-{kind.name}.gguf", kind
    )


@functools.cache
def model(fam: str, source: str, tmp_root: str) -> DecoderModel:
    path = FIXTURES / fam / "hf" if source == "hf" else gguf_path(fam, tmp_root)
    return build_model(open_checkpoint(path), cpu_backend("numpy"), MAX_POSITIONS)


def scale(fam: str) -> float:
    return max(1.0, float(np.abs(reference(fam)["logits"]).max()))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fam", FAMILIES)
def test_one_prefill_matches_transformers(fam: str, source: str, tmp_root: str) -> None:
    expected = reference(fam)["logits"]
    ours = Runner(model(fam, source, tmp_root)).step([(0, manifest(fam)["tokens"], 0)])[0]
    assert np.abs(ours - expected).max() <= RTOL * scale(fam)
    assert (ours.argmax(-1) == expected.argmax(-1)).all()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fam", FAMILIES)
def test_chunked_prefill_and_greedy_decode_match_transformers(fam: str, source: str, tmp_root: str) -> None:
    man, ref = manifest(fam), reference(fam)
    logits, greedy, second = chunked_then_greedy(
        model(fam, source, tmp_root), man["tokens"], len(man["greedy"])
    )
    assert np.abs(logits - ref["logits"]).max() <= RTOL * scale(fam)
    assert greedy == man["greedy"]
    # transformers' first generated step reads the prompt's last logits; its second, our first decode
    first = log_softmax(logits[-1])
    top5 = np.argsort(-first, kind="stable")[:5]
    assert top5.tolist() == man["top5_ids"]
    assert np.abs(first[top5] - ref["top5_logprobs"]).max() <= 1e-3
    assert np.abs(second - ref["step_logits"][1]).max() <= RTOL * scale(fam)


# Nemotron-H's GGUF in the fast tier; the rest (numba's first compile of each format takes a while on a
# fresh clone) in the slow one.
NUMBA_CASES = [
    (fam, source)
    if (fam, source) == ("nemotron_h", "gguf")
    else pytest.param(fam, source, marks=pytest.mark.slow)
    for fam in FAMILIES
    for source in SOURCES
]


@pytest.mark.parametrize(("fam", "source"), NUMBA_CASES)
def test_numba_backend_matches_transformers(fam: str, source: str, tmp_root: str) -> None:
    """On the numba CPU backend (its products over the file's blocks; the Mamba-2 layer runs the numpy
    ops it inherits): the same logits, greedy tokens and top-5 log-probs."""
    path = FIXTURES / fam / "hf" if source == "hf" else gguf_path(fam, tmp_root)
    m = build_model(open_checkpoint(path), cpu_backend("numba"), MAX_POSITIONS)
    man, ref = manifest(fam), reference(fam)
    logits, greedy, _ = chunked_then_greedy(m, man["tokens"], len(man["greedy"]))
    assert np.abs(logits - ref["logits"]).max() <= RTOL * scale(fam)
    assert greedy == man["greedy"]
    first = log_softmax(logits[-1])
    assert np.abs(first[man["top5_ids"]] - ref["top5_logprobs"]).max() <= 1e-3


def test_f16_gguf_on_the_numba_backend(tmp_root: str) -> None:
    """Nemotron-H from an F16 GGUF (weights rounded to f16) on the numba backend: the same greedy tokens."""
    fam = "nemotron_h"
    m = build_model(open_checkpoint(gguf_path(fam, tmp_root, GQ.F16)), cpu_backend("numba"), MAX_POSITIONS)
    man, ref = manifest(fam), reference(fam)
    logits, greedy, _ = chunked_then_greedy(m, man["tokens"], len(man["greedy"]))
    assert greedy == man["greedy"]
    first = log_softmax(logits[-1])
    assert np.abs(first[man["top5_ids"]] - ref["top5_logprobs"]).max() <= 1e-2  # f16-rounded weights


# -- through the engine -------------------------------------------------------------------------


def engine(fam: str, source: str, tmp_root: str, **fields: Any) -> LLMEngine:
    """An engine on the fixture (the HF folder with a byte-level tokenizer.json beside it, or the GGUF)
    in 8-token prefill steps."""
    path = engine_folder(fam, tmp_root) if source == "hf" else gguf_path(fam, tmp_root)
    settings: dict[str, Any] = dict(model=str(path), device="cpu", cpu_kernels="numpy", max_num_seqs=8,
                                    max_num_batched_tokens=8, block_size=8, max_model_len=512,
                                    kv_cache_bytes=64 << 20, enable_prefix_caching=False)  # fmt: skip
    return LLMEngine(EngineConfig(**{**settings, **fields}))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fam", FAMILIES)
def test_engine_greedy_and_top5_in_small_prefill_chunks_match_transformers(
    fam: str, source: str, tmp_root: str
) -> None:
    """The 72-token prompt prefilled in 8-token steps, then greedy decode, through LLMEngine:
    transformers' greedy tokens and first-step top-5 log-probs."""
    man, ref = manifest(fam), reference(fam)
    eng = engine(fam, source, tmp_root)
    assert eng.model_config.is_hybrid and len(man["tokens"]) > 8 * 8
    (result,) = eng.generate([man["tokens"]], greedy_params(len(man["greedy"]), logprobs=5))
    assert result["token_ids"] == man["greedy"]
    top = result["logprobs"][0].top
    assert [t for t, _ in top] == man["top5_ids"]
    assert np.abs(np.array([lp for _, lp in top]) - ref["top5_logprobs"]).max() <= 1e-3


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fam", FAMILIES)
def test_engine_sequences_in_a_batch_of_eight_match_each_alone(fam: str, source: str, tmp_root: str) -> None:
    tokens = manifest(fam)["tokens"]
    prompts = [tokens[i : i + n] for i, n in enumerate((5, 12, 17, 23, 30, 41, 52, 66))]
    eng = engine(fam, source, tmp_root, max_num_batched_tokens=40)
    params = greedy_params(6)
    alone = [eng.generate([p], params)[0]["token_ids"] for p in prompts]
    assert [r["token_ids"] for r in eng.generate(prompts, params)] == alone
    assert all(len(a) == 6 for a in alone)


@pytest.mark.parametrize("fam", ["nemotron_h", "granite_hybrid"])
def test_engine_prefix_hit_resumes_the_mamba2_state(fam: str, tmp_root: str) -> None:
    """A second request sharing 64 tokens resumes the conv and SSM states from the snapshot the first
    left, and generates what an engine without the prefix cache generates."""
    tokens = manifest(fam)["tokens"]
    first, second = tokens[:70], tokens[:64] + tokens[::-1][:6]
    params = greedy_params(8)
    expected = engine(fam, "hf", tmp_root).generate([second], params)[0]["token_ids"]
    eng = engine(fam, "hf", tmp_root, enable_prefix_caching=True, state_snapshot_interval=16)
    eng.generate([first], params)
    (result,) = eng.generate([second], params)
    assert result["num_cached_tokens"] >= 48
    assert result["token_ids"] == expected


def test_quantized_gguf_equals_its_float_values(tmp_root: str) -> None:
    """Nemotron-H as a Q8_0 GGUF (the converter's rule keeps A, D, the conv, norms and biases F32):
    the model equals one built from the same file with every tensor dequantized to float32."""
    checkpoint = open_checkpoint(gguf_path("nemotron_h", tmp_root, GQ.Q8_0))
    types = {name: t.qtype.name for name, t in checkpoint.tensors.items()}
    assert (
        types["blk.0.ssm_in.weight"]
        == types["blk.0.ssm_out.weight"]
        == types["blk.1.ffn_up.weight"]
        == "Q8_0"
    )
    assert types["blk.0.ssm_a"] == types["blk.0.ssm_conv1d.weight"] == types["blk.0.ssm_norm.weight"] == "F32"
    floats = {
        n: QuantizedTensor.from_float(n, t.dequantize(), QUANT_TYPES["F32"])
        for n, t in checkpoint.tensors.items()
    }
    as_floats = dataclasses.replace(checkpoint, tensors=floats)
    tokens = manifest("nemotron_h")["tokens"]
    ours = Runner(build_model(checkpoint, cpu_backend("numpy"), MAX_POSITIONS)).step([(0, tokens, 0)])[0]
    expected = Runner(build_model(as_floats, cpu_backend("numpy"), MAX_POSITIONS)).step([(0, tokens, 0)])[0]
    assert np.abs(ours - expected).max() <= 1e-5 * max(1.0, float(np.abs(expected).max()))
    assert (
        ours.argmax(-1) == reference("nemotron_h")["logits"].argmax(-1)
    ).mean() > 0.9  # Q8_0's error is small


# -- the scan's two forms -----------------------------------------------------------------------


def _scan_inputs(length: int, heads: int = 4, groups: int = 2) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(length)
    p, n = 8, 6
    x = rng.normal(size=(length, heads, p)).astype(np.float32)
    dt = np.log1p(np.exp(rng.normal(-1.0, 1.0, (length, heads)))).astype(np.float32)
    a = -np.arange(1, heads + 1, dtype=np.float32)
    b, c = (rng.normal(size=(length, groups, n)).astype(np.float32) for _ in range(2))
    d = rng.normal(1.0, 0.3, heads).astype(np.float32)
    return x, dt, a, b, c, d, rng.normal(size=(heads, p, n)).astype(np.float32)


@pytest.mark.parametrize("length", [1, 5, 16, 100, 300])
def test_chunked_and_recurrent_ssd_agree(length: int) -> None:
    x, dt, a, b, c, _, s0 = _scan_inputs(length)
    bh, ch = (np.repeat(v, 2, axis=1) for v in (b, c))  # heads 0, 1 read group 0; heads 2, 3 group 1
    y_r, s_r = ssd_recurrent(np, x, dt, a, bh, ch, s0)
    y_c, s_c = ssd_chunked(np, x, dt, a, bh, ch, s0)
    tol = 1e-5 * max(1.0, float(np.abs(y_r).max()))
    assert np.abs(y_r - y_c).max() <= tol and np.abs(s_r - s_c).max() <= tol
    if length == 1:
        return
    # in two pieces, the state carried between them: the same as in one
    cut = length // 2
    first, s_mid = ssd_chunked(np, x[:cut], dt[:cut], a, bh[:cut], ch[:cut], s0)
    second, s_end = ssd_chunked(np, x[cut:], dt[cut:], a, bh[cut:], ch[cut:], s_mid)
    assert np.abs(np.concatenate([first, second]) - y_r).max() <= tol
    assert np.abs(s_end - s_r).max() <= tol


def test_scan_per_sequence_slots_chunk_size_and_skip() -> None:
    """ssd_scan walks the batch: each sequence's own slot, from zeros or from the slot's state, any
    chunk size giving the same result; D x is added; the slots hold the final states."""
    x, dt, a, b, c, d, s0 = _scan_inputs(40)
    ends = [0, 7, 40]  # sequence 0: 7 tokens continuing slot 2; sequence 1: 33 tokens from zeros in slot 0
    qsl, slots, initial = np.array(ends), np.array([2, 0]), np.array([True, False])
    meta = AttentionMetadata(
        qsl, np.array([10, 33]), np.zeros((2, 1), np.int32), np.zeros(40, np.int32), np.zeros(40, np.int32),
        33, 33, 16, host_query_start_loc=qsl, host_state_slots=slots, host_has_initial_state=initial,
    )  # fmt: skip
    results = []
    for chunk in (4, 16, 256):
        state = np.full((3, *s0.shape), 7.0, np.float32)  # slot 0's leftovers must not be read
        state[2] = s0
        results.append((ssd_scan(np, x, dt, a, b, c, d, state, meta, chunk), state))
    y, state = results[0]
    bh, ch = (np.repeat(v, 2, axis=1) for v in (b, c))
    y0, s_first = ssd_recurrent(np, x[:7], dt[:7], a, bh[:7], ch[:7], s0)
    y1, s_second = ssd_recurrent(np, x[7:], dt[7:], a, bh[7:], ch[7:], np.zeros_like(s0))
    expected = np.concatenate([y0, y1]) + x * d[:, None]
    assert np.abs(y - expected).max() <= 1e-5 * float(np.abs(expected).max())
    assert np.abs(state[2] - s_first).max() <= 1e-5 and np.abs(state[0] - s_second).max() <= 1e-5
    assert (state[1] == 7.0).all()  # a slot no sequence owns is left alone
    for other, other_state in results[1:]:
        assert np.abs(other - y).max() <= 1e-5 * float(np.abs(y).max())
        assert np.abs(other_state - state).max() <= 1e-5


def test_scan_of_a_decode_batch_steps_every_sequence_at_once() -> None:
    """One token per sequence: the batched step equals each sequence's own step (from its slot, or from
    zeros where it starts there), and writes each slot."""
    x, dt, a, b, c, d, _ = _scan_inputs(5)
    slots, initial = np.array([3, 0, 4, 1, 2]), np.array([True, False, True, True, False])
    qsl = np.arange(6, dtype=np.int32)
    meta = AttentionMetadata(
        qsl, np.full(5, 9, np.int32), np.zeros((5, 1), np.int32), np.zeros(5, np.int32), np.zeros(5, np.int32),
        1, 9, 16, host_query_start_loc=qsl, state_slots=slots, has_initial_state=initial,
        host_state_slots=slots, host_has_initial_state=initial,
    )  # fmt: skip
    start = np.random.default_rng(1).normal(0, 3, (5, 4, 8, 6)).astype(np.float32)
    state = start.copy()
    y = ssd_scan(np, x, dt, a, b, c, d, state, meta, 16)
    bh, ch = (np.repeat(v, 2, axis=1) for v in (b, c))
    for i, (slot, init) in enumerate(zip(slots, initial, strict=True)):
        s0 = start[slot] if init else np.zeros_like(start[slot])
        y_i, s_i = ssd_recurrent(np, x[i : i + 1], dt[i : i + 1], a, bh[i : i + 1], ch[i : i + 1], s0)
        np.testing.assert_allclose(y[i], y_i[0] + x[i] * d[:, None], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state[slot], s_i, rtol=1e-5, atol=1e-6)


def test_sigmoid_grouped_routing_keeps_to_the_best_groups() -> None:
    """Nemotron-H's router: experts only from the topk_group best groups (by their two best biased
    scores), chosen by the biased scores, weighted by the unbiased ones, renormalised and scaled."""
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(50, 8)).astype(np.float32)
    bias = rng.normal(0, 0.5, 8).astype(np.float32)
    spec = MoeSpec(8, 2, 4, routing="sigmoid_grouped", num_groups=4, topk_groups=2, routed_scale=2.5)
    weights, chosen = route(np, logits, spec, bias)
    scores = 1 / (1 + np.exp(-logits.astype(np.float64)))
    for t in range(50):
        biased = scores[t] + bias
        group_score = np.sort(biased.reshape(4, 2), axis=-1).sum(-1)
        groups = set(np.argsort(-group_score)[:2].tolist())
        allowed = [e for e in range(8) if e // 2 in groups]
        best = sorted(allowed, key=lambda e: -biased[e])[:2]
        assert sorted(chosen[t].tolist()) == sorted(best)
        picked = scores[t][chosen[t]]
        np.testing.assert_allclose(weights[t], 2.5 * picked / picked.sum(), rtol=1e-5)


# -- configs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fam", FAMILIES)
def test_config_from_both_sources(fam: str, tmp_root: str) -> None:
    hf = model_config(open_checkpoint(FIXTURES / fam / "hf"))
    gg = model_config(open_checkpoint(gguf_path(fam, tmp_root)))
    layers = tuple(zip(*LAYERS[fam], strict=True))
    assert hf.layer_mixers == gg.layer_mixers == layers[0]
    assert hf.layer_ffns == gg.layer_ffns == layers[1]
    assert hf.architecture == gg.architecture == ARCH[fam]
    rope = fam == "granite_hybrid_dense"  # the others: no positions in attention, as the released models
    assert hf.use_rope is gg.use_rope is rope
    for field in ("num_heads", "head_dim", "state_size", "n_groups", "conv_kernel"):
        assert getattr(hf.mamba2, field) == getattr(gg.mamba2, field)
    assert hf.mamba2.chunk_size == 16  # the GGUF does not say it: its default (the result is the same)
    for field in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size"):
        assert getattr(hf, field) == getattr(gg, field), field
    assert abs(hf.rms_norm_eps - gg.rms_norm_eps) <= 1e-6 * hf.rms_norm_eps
    if fam == "granite_hybrid":
        for field, value in (("embedding_scale", 2.0), ("residual_scale", 0.5), ("logit_scale", 2.5)):
            assert getattr(hf, field) == getattr(gg, field) == value
        assert hf.query_scale == pytest.approx(0.09) and gg.query_scale == pytest.approx(0.09)
    if hf.moe is not None:
        assert hf.moe == gg.moe


def test_nemotron_h_moe_routing_is_read_from_both_sources(tmp_root: str) -> None:
    hf = model_config(open_checkpoint(FIXTURES / "nemotron_h_moe" / "hf"))
    assert hf.moe == MoeSpec(
        num_experts=8, num_used=2, intermediate_size=24, routing="sigmoid_grouped", num_groups=2, topk_groups=1,
        routed_scale=2.5, activation="relu2", shared_intermediate_size=40,
    )  # fmt: skip
    assert model_config(open_checkpoint(gguf_path("nemotron_h_moe", tmp_root))).moe == hf.moe
    latent = model_config(open_checkpoint(gguf_path("nemotron_h_latent", tmp_root))).moe
    assert latent is not None and latent.latent_size == 16


def test_nemotron_h_layer_pattern_spellings() -> None:
    """Hub files say `hybrid_override_pattern`; transformers 5 saves `layers_block_type` (either names)."""
    base = hf_config("nemotron_h")
    assert base["hybrid_override_pattern"] == "M-*M-"
    expected = family("nemotron_h").config_from_hf(base)
    listed = {k: v for k, v in base.items() if k != "hybrid_override_pattern"}
    for names in (["mamba", "mlp", "attention", "mamba", "mlp"],
                  ["linear_attention", "mlp", "full_attention", "linear_attention", "mlp"]):  # fmt: skip
        cfg = family("nemotron_h").config_from_hf({**listed, "layers_block_type": names})
        assert (cfg.layer_mixers, cfg.layer_ffns) == (expected.layer_mixers, expected.layer_ffns)
    # older hub configs name it attention_head_dim (32, not hidden / heads = 16: it is read, not derived)
    older = {k: v for k, v in base.items() if k != "head_dim"}
    assert family("nemotron_h").config_from_hf({**older, "attention_head_dim": 32}).head_dim == 32


@pytest.mark.parametrize(
    ("fam", "change", "message"),
    [
        ("nemotron_h", {"hybrid_override_pattern": "M-X*-"}, "hybrid_override_pattern"),
        ("nemotron_h", {"num_hidden_layers": 7}, "num_hidden_layers"),
        ("nemotron_h", {"mlp_hidden_act": "silu"}, "mlp_hidden_act"),
        ("nemotron_h", {"n_groups": 3}, "n_groups"),
        ("nemotron_h_latent", {"moe_latent_size": 0}, "moe_latent_size"),
        ("nemotron_h_moe", {"n_group": 3}, "experts in 3 groups"),
        ("granite_hybrid", {"layer_types": ["mamba", "sliding_attention", "mamba"]}, "layer_types"),
        ("granite_hybrid", {"position_embedding_type": "alibi"}, "position_embedding_type"),
    ],
)
def test_configs_no_real_model_has_are_refused_by_name(
    fam: str, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(CheckpointError, match=message):
        family(ARCH[fam]).config_from_hf({**hf_config(fam), **change})


def test_nope_attention_table_costs_no_memory_at_the_gguf_context(tmp_root: str) -> None:
    """A NoPE GGUF says 2^20 positions (the converter's value): its identity rotation table is one row
    seen at every position, not 2^20 rows (512 MB for these head dims at full size)."""
    checkpoint = open_checkpoint(gguf_path("nemotron_h", tmp_root))
    cfg = model_config(checkpoint)
    assert cfg.context_length == 2**20 and not cfg.use_rope
    m = build_model(checkpoint, cpu_backend("numpy"), cfg.context_length, cfg)
    table = m.layers[2].attn.spec.rope
    assert table.cos.shape[0] == 2**20 and table.cos.strides[0] == 0 and table.sin.strides[0] == 0
    assert (table.cos[[0, 2**20 - 1]] == 1).all() and (table.sin[[0, 2**20 - 1]] == 0).all()


def test_nemotron_h_moe_gguf_with_an_mtp_block(tmp_root: str) -> None:
    """The converter appends the multi-token-prediction head as one more block (`nextn_predict_layers`):
    the model is the blocks before it, as transformers' (which skips `mtp.*`)."""
    fam = "nemotron_h_moe"
    path = write_mamba_gguf(FIXTURES / fam / "hf", ARCH[fam], Path(tmp_root) / "mtp.gguf", mtp_block=True)
    checkpoint = open_checkpoint(path)
    assert "blk.5.nextn.eh_proj.weight" in checkpoint.tensors
    cfg = model_config(checkpoint)
    assert (cfg.num_layers, cfg.trailing_blocks) == (5, 1)
    ours = Runner(build_model(checkpoint, cpu_backend("numpy"), MAX_POSITIONS)).step(
        [(0, manifest(fam)["tokens"], 0)]
    )[0]
    assert np.abs(ours - reference(fam)["logits"]).max() <= RTOL * scale(fam)


def test_gguf_without_ssm_keys_is_refused_by_name(tmp_root: str) -> None:
    checkpoint = open_checkpoint(gguf_path("nemotron_h", tmp_root))
    meta = {k: v for k, v in checkpoint.metadata.items() if k != "nemotron_h.ssm.state_size"}
    with pytest.raises(CheckpointError, match=r"nemotron_h\.ssm\.state_size"):
        family("nemotron_h").config_from_gguf(meta, checkpoint.tensors["token_embd.weight"].shape[0])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop("blk.0.ssm_d"), r"tensor blk\.0\.ssm_d \(Mamba-2 layer\) is missing"),
        (lambda t: t.update({"blk.3.ssm_dt.bias": t["blk.3.ssm_d"]}), None),  # same size: accepted
        (
            lambda t: t.update({"blk.3.ssm_norm.weight": t["blk.3.ssm_d"]}),
            r"ssm_d.*has shape .*needs \(128,\)",
        ),
        (
            lambda t: t.update({"blk.0.ssm_in.weight": t["blk.0.ssm_out.weight"]}),
            r"ssm_in\.weight has 64 rows",
        ),
    ],
)
def test_a_mamba2_layer_names_the_tensor_it_cannot_use(
    change: Any, message: str | None, tmp_root: str
) -> None:
    checkpoint = open_checkpoint(gguf_path("nemotron_h", tmp_root))
    tensors = dict(checkpoint.tensors)
    change(tensors)
    broken = dataclasses.replace(checkpoint, tensors=tensors)
    cfg = model_config(checkpoint)
    if message is None:
        build_model(broken, cpu_backend("numpy"), MAX_POSITIONS, cfg)
        return
    with pytest.raises(CheckpointError, match=message):
        build_model(broken, cpu_backend("numpy"), MAX_POSITIONS, cfg)


def test_decode_graphs_hold_mamba2_layers_only_where_their_ops_stay_on_the_device(tmp_root: str) -> None:
    """Decoder.syncs_host, what keeps CUDA graphs off: on the numpy backend the Mamba-2 ops walk the
    batch's sequences on the host; on a backend whose recurrent ops read them on the device (CUDA's
    `recurrent_syncs_host = False`) a dense Nemotron-H reads nothing back, and in its MoE variant the
    experts decide (here the numpy layer's per-expert loop, which reads the router's choices)."""

    class DeviceRecurrent(CpuBackend):
        recurrent_syncs_host = False

    checkpoint = open_checkpoint(gguf_path("nemotron_h", tmp_root))
    assert build_model(checkpoint, cpu_backend("numpy"), MAX_POSITIONS).syncs_host
    assert not build_model(checkpoint, DeviceRecurrent(), MAX_POSITIONS).syncs_host
    moe = build_model(open_checkpoint(gguf_path("nemotron_h_moe", tmp_root)), DeviceRecurrent(), MAX_POSITIONS)
    assert moe.syncs_host


def test_fixtures_are_small() -> None:
    for fam in FAMILIES:
        size = sum(p.stat().st_size for p in (FIXTURES / fam).rglob("*") if p.is_file())
        assert size < 300_000, f"{fam}: {size} bytes"
