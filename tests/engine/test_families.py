"""Each model family against Hugging Face transformers, on tiny random-weight checkpoints.

tests/fixtures/families/ holds, per family (llama, qwen2, qwen3, gemma3), an HF folder and a
GGUF written the way llama.cpp's converter writes one (quantized in several ways), plus
transformers' float32 logits at every position of a 40-token sequence; its manifest says what
each case stores and where its reference came from. tests/fixtures/make_family_reference.py
made them (run it in .venv-ref; this test never imports torch or transformers).

Tolerance: max |ours - reference| <= 1e-5 * scale over all positions and the whole vocabulary,
where scale = max(1, max |reference logit|) of the case. Both sides compute in float32 from
identical weights (quantized files included: the reference is transformers dequantizing the
very blocks we dequantize, so quantization adds no error here), so the difference is float32
summation order only: measured <= 7e-7 * scale. Wrong RoPE scaling, window or query scale
move these logits by 5-30 % of scale; an RMS-norm epsilon off by 10x moves them by only
~1e-5 * scale, at the bound, so the config test checks epsilon (and every other field) directly. The run modes (one prefill,
chunked prefill, decode, decode batched with another request) must agree with each other to
the same bound: OpenBLAS's small-matrix kernels make a row's result depend on the batch's
row count by ~1e-6, so they agree to float32 noise, not bit for bit. Greedy argmax must match
at every position: the fixtures' smallest top-2 gap is 2.9e-3, far above the noise.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_harness import MODES, run_logits  # sibling module: pytest puts tests/engine on sys.path

from app.engine.backend import cpu_backend
from app.engine.loader.names import architecture_of
from app.engine.loader.weights import open_checkpoint
from app.engine.models.config import ModelConfig
from app.engine.models.decoder import DecoderModel
from app.engine.models.registry import build_model, family, model_config, supported_architectures

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))
TOKENS: list[int] = MANIFEST["tokens"]
CASES: dict[str, dict[str, Any]] = {case["name"]: case for case in MANIFEST["cases"]}
RTOL = 1e-5  # of the case's logit scale; see the module docstring
MAX_POSITIONS = 64
MAX_FIXTURE_BYTES = 4_500_000  # seven families, two files each


@functools.cache
def reference(name: str) -> np.ndarray:
    with np.load(FIXTURES / "references.npz") as refs:
        return refs[name]


def tolerance(name: str) -> float:
    return RTOL * max(1.0, float(np.abs(reference(name)).max()))


@functools.cache
def model(name: str, kernels: str = "numpy") -> DecoderModel:
    checkpoint = open_checkpoint(FIXTURES / CASES[name]["path"])
    return build_model(checkpoint, cpu_backend(kernels), MAX_POSITIONS)


@functools.cache
def our_logits(name: str, mode: str, kernels: str = "numpy") -> np.ndarray:
    built = model(name, kernels)
    return run_logits(built, built.backend, TOKENS, mode)


def assert_logits_close(ours: np.ndarray, expected: np.ndarray, tol: float, what: str) -> None:
    """Fail with the first position over `tol`, its worst vocabulary entry, and the overall worst."""
    assert ours.shape == expected.shape, f"{what}: logits shape {ours.shape}, expected {expected.shape}"
    assert np.isfinite(ours).all(), (
        f"{what}: non-finite logits at positions {np.flatnonzero(~np.isfinite(ours).all(-1))}"
    )
    diff = np.abs(ours.astype(np.float64) - expected)
    per_position = diff.max(axis=-1)
    over = np.flatnonzero(per_position > tol)
    if over.size:
        pos = int(over[0])
        vocab = int(diff[pos].argmax())
        worst = int(per_position.argmax())
        raise AssertionError(
            f"{what}: {over.size} of {len(per_position)} positions differ by more than {tol:.3g}; "
            f"first at position {pos} (token {TOKENS[pos]}): max |diff| {per_position[pos]:.4g} at vocab id "
            f"{vocab} (ours {ours[pos, vocab]:.6g}, expected {expected[pos, vocab]:.6g}); "
            f"worst {per_position[worst]:.4g} at position {worst}. Positions over: {over[:12].tolist()}"
        )


def assert_same_argmax(ours: np.ndarray, expected: np.ndarray, what: str) -> None:
    ours_ids, expected_ids = ours.argmax(axis=-1), expected.argmax(axis=-1)
    differ = np.flatnonzero(ours_ids != expected_ids)
    if differ.size:
        pos = int(differ[0])
        top2 = np.sort(expected[pos])[-2:]
        raise AssertionError(
            f"{what}: greedy token differs at {differ.size} positions, first at {pos}: ours {ours_ids[pos]}, "
            f"expected {expected_ids[pos]} (expected top-2 gap {top2[1] - top2[0]:.3g}; "
            f"max |diff| there {np.abs(ours[pos] - expected[pos]).max():.3g})"
        )


# Both CPU products: the numpy reference and the numba kernels over the blocks (backend/cpu_fast/);
# the GGUF cases hold every format those kernels read (F16, BF16, Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K, Q6_K).
# numba's first compile of all ten formats takes ~2 minutes of CPU on a fresh clone (then its disk
# cache answers in seconds): slow tier.
KERNELS = ["numpy", pytest.param("numba", marks=pytest.mark.slow)]


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers(name: str, mode: str, kernels: str) -> None:
    ours, expected = our_logits(name, mode, kernels), reference(name)
    what = f"{name} ({mode}, {kernels} kernels) vs transformers"
    assert_logits_close(ours, expected, tolerance(name), what)
    assert_same_argmax(ours, expected, what)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("name", list(CASES))
def test_run_modes_agree(name: str, kernels: str) -> None:
    """Chunking, decoding and batching change only float32 rounding, never which KV a token sees."""
    baseline = our_logits(name, "prefill", kernels)
    for mode in MODES[1:]:
        ours = our_logits(name, mode, kernels)
        assert_logits_close(ours, baseline, tolerance(name), f"{name}: {mode} vs one prefill")
        assert_same_argmax(ours, baseline, f"{name}: {mode} vs one prefill")


@pytest.mark.parametrize("name", list(CASES))
def test_config_read_as_transformers_reads_it(name: str) -> None:
    """The engine's parse of each file equals the architecture transformers ran (see the manifest)."""
    checkpoint = open_checkpoint(FIXTURES / CASES[name]["path"])
    # The engine ties the head when the config says so or the file has no head of its own.
    assert_config_facts(
        model_config(checkpoint), CASES[name]["expected_config"], name, "output.weight" in checkpoint.tensors
    )


@pytest.mark.parametrize("variant", MANIFEST["config_variants"], ids=lambda v: v["name"])
def test_config_json_variants_read_as_transformers_reads_them(variant: dict[str, Any]) -> None:
    """Hub config.json files name only what differs from transformers' defaults; transformers 5 renames keys."""
    config = variant["config"]
    cfg = family(architecture_of(config)).config_from_hf(config)
    assert_config_facts(cfg, variant["expected_config"], variant["name"], has_output=True)  # config decides


def assert_config_facts(cfg: ModelConfig, expected: dict[str, Any], what: str, has_output: bool) -> None:
    ours: dict[str, Any] = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_layers,
        "num_heads": cfg.num_heads,
        "num_kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings or not has_output,
        "attention_scale": cfg.attention_scale,
        "layer_sliding": [cfg.is_sliding(i) for i in range(cfg.num_layers)],
        "rope_theta": cfg.rope_theta,
        "rope_theta_local": cfg.rope_theta_local,
        "sliding_window": cfg.sliding_window,
        "rope_scaling": _scaling(cfg.rope_scaling, expected.get("rope_scaling")),
        "embedding_scale": cfg.embedding_scale,
        "residual_scale": cfg.residual_scale,
        "logit_scale": cfg.logit_scale,
        "moe": None if cfg.moe is None else {key: getattr(cfg.moe, key) for key in expected.get("moe") or {}},
    }
    wrong = {key: (ours[key], value) for key, value in expected.items() if not _same(ours[key], value)}
    assert not wrong, f"{what}: fields read differently from transformers (ours, transformers): {wrong}"


def _scaling(ours: Any, expected: dict[str, Any] | None) -> dict[str, Any] | None:
    if ours is None:
        return None
    return {key: getattr(ours, key) for key in (expected or {"kind": None})}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-6)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_gguf_tensor_types_are_read_as_written() -> None:
    """The quantized cases really run through the formats the manifest lists (mixed per tensor)."""
    for case in CASES.values():
        if case["format"] != "gguf":
            continue
        tensors = open_checkpoint(FIXTURES / case["path"]).tensors
        read = {name: tensor.qtype.name for name, tensor in tensors.items()}
        assert read == case["tensors"], f"{case['name']}: tensor types read {read}, written {case['tensors']}"


# Families whose parity fixtures live elsewhere, and formats a family refuses to read (checked
# below: once it reads them, it needs a fixture here).
COVERED_ELSEWHERE = {
    ("qwen2vl", "safetensors"): "tests/fixtures/vision/qwen2_5_vl (vision/test_qwen_vl.py)",
    ("qwen2vl", "gguf"): "converted at test time by tests/fixtures/make_qwen_vl_gguf.py (test_qwen_vl_gguf.py)",
    ("gemma4", "safetensors"): "tests/fixtures/gemma4 (test_gemma4.py)",
    ("gemma4", "gguf"): "written at test time by tests/engine/gemma4_gguf.py (test_gemma4.py)",
    ("laguna", "safetensors"): "tests/fixtures/laguna (test_laguna.py)",
    ("laguna", "gguf"): "written at test time by tests/engine/laguna_gguf.py (test_laguna.py)",
    ("muse-glimmer", "safetensors"): "tests/fixtures/muse_glimmer (test_muse_glimmer.py)",
    ("muse-glimmer", "gguf"): "written at test time by tests/engine/muse_glimmer_gguf.py (test_muse_glimmer.py)",
    ("paddleocr", "safetensors"): "tests/fixtures/vision/paddleocr_vl (vision/test_paddleocr_vl.py)",
    ("paddleocr", "gguf"): "converted at test time by tests/fixtures/make_paddleocr_vl_gguf.py "
    "(vision/test_paddleocr_vl_gguf.py)",
    # llama.cpp's text arch for Qwen3-ASR's GGUF; its folder's text side is read as qwen3, the same family
    ("qwen3vl", "safetensors"): "tests/fixtures/qwen3_asr (audio/test_qwen3_asr.py), its text side read as qwen3",
    ("qwen3vl", "gguf"): "written at test time by tests/qwen3_asr_pair.py (audio/test_qwen3_asr_gguf.py)",
    **{
        (arch, fmt): "tests/fixtures/hybrid/ HF folders, GGUFs written at test time (test_hybrid_qwen.py)"
        for arch in ("qwen35", "qwen35moe", "qwen3next")
        for fmt in ("safetensors", "gguf")
    },
    **{
        (arch, fmt): "tests/fixtures/hybrid/ HF folders, GGUFs written at test time (test_hybrid_mamba.py)"
        for arch in ("nemotron_h", "nemotron_h_moe", "granitehybrid")
        for fmt in ("safetensors", "gguf")
    },
}


def test_fixtures_cover_every_family_both_formats_and_quantizations() -> None:
    covered = {(case["family"], case["format"]) for case in CASES.values()} | set(COVERED_ELSEWHERE)
    for arch in supported_architectures():
        assert {(arch, "safetensors"), (arch, "gguf")} <= covered, f"no HF folder or GGUF fixture for {arch}"
    types = {t for case in CASES.values() for t in case.get("tensor_types", [])}
    assert {"Q8_0", "Q4_K", "Q5_K", "Q6_K", "BF16", "F16"} <= types, types
    size = sum(path.stat().st_size for path in FIXTURES.rglob("*") if path.is_file())
    assert size < MAX_FIXTURE_BYTES, (
        f"tests/fixtures/families is {size} bytes; keep it under {MAX_FIXTURE_BYTES}"
    )
    for name in CASES:  # references long enough to cross the sliding window and many KV blocks
        assert reference(name).shape == (len(TOKENS), CASES[name]["expected_config"]["vocab_size"])


def test_sinks_outside_a_backends_head_dims_are_refused_at_load() -> None:
    """A backend whose attention with sinks takes only some head dims (CUDA: 64, 128, 256) refuses a
    GPT-OSS of another (the tiny fixture's 16) when the model is built, naming both and the way out."""
    from app.engine.backend.cpu import CpuBackend

    class HeadDimsOfCuda(CpuBackend):
        name = "cuda-like"
        sink_head_dims = (64, 128, 256)

    path = FIXTURES / "gpt-oss" / "gpt-oss-bf16-q8_0.gguf"
    with pytest.raises(NotImplementedError, match=r"takes head dims \(64, 128, 256\), this model's is 16;.*--device cpu"):
        build_model(open_checkpoint(path), HeadDimsOfCuda(), 64)
    assert build_model(open_checkpoint(path), CpuBackend(), 64).config.attention_sinks  # the CPU takes any
