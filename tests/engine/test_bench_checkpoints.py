"""The benchmarks' random quantized checkpoints load, keep each tensor in its planned format, and run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from model_harness import run_logits

from app.engine.backend.cpu import CpuBackend
from app.engine.loader.tokenizer import Tokenizer
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import make_random_gguf
import make_random_safetensors


def _runs(path: Path) -> None:
    checkpoint = open_checkpoint(path)
    model = build_model(checkpoint, CpuBackend(), 64)
    logits = run_logits(model, model.backend, list(range(1, 13)), "prefill")
    assert np.isfinite(logits).all() and 0.1 < logits.std() < 10  # weights scaled so activations stay O(1)


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("fp8-block", {"FP8_E4M3": 14, "BF16": 2, "F32": 9}),
        ("nvfp4", {"NVFP4_SPLIT": 14, "BF16": 2, "F32": 9}),
        ("mix", {"FP8_E4M3": 10, "NVFP4_SPLIT": 4, "BF16": 2, "F32": 9}),
    ],
)
def test_random_safetensors(tmp_path: Path, fmt: str, expected: dict[str, int]) -> None:
    out = tmp_path / fmt
    make_random_safetensors.write("tiny", fmt, out)
    checkpoint = open_checkpoint(out)
    assert dict(checkpoint.quant_mix) == expected
    if fmt == "fp8-block":
        assert checkpoint.tensors["blk.0.attn_q.weight"].scales.group == (128, 128)
    assert Tokenizer.from_pretrained_dir(out).eos_token_id == make_random_gguf.SHAPES["tiny"].vocab - 1
    _runs(out)


@pytest.mark.parametrize(("mix", "formats"), [("mxfp4", {"MXFP4", "Q8_0", "Q6_K", "F32"}),
                                              ("iq4_xs", {"IQ4_XS", "Q6_K", "Q4_K", "F32"}),
                                              ("nvfp4", {"NVFP4", "Q8_0", "Q6_K", "F32"})])  # fmt: skip
def test_random_gguf_new_mixes(tmp_path: Path, mix: str, formats: set[str]) -> None:
    path = tmp_path / f"{mix}.gguf"
    make_random_gguf.write("tiny", mix, path)
    assert {name for name, _ in open_checkpoint(path).quant_mix} == formats
    _runs(path)


@pytest.mark.parametrize("shape", ["gemma4-tiny", "gemma4-tiny-moe"])
def test_random_gemma4_in_llama_cpp_q4_k_m_layout(tmp_path: Path, shape: str) -> None:
    """The Gemma 4 shapes: llama-quantize's Q4_K_M picks (the tied embedding Q6_K, attn_v only on the sliding
    layers, Q6_K on the `use_more_bits` layers' attn_v and ffn_down, rows of 96 weights on the 32-weight
    fallbacks), read by the engine as sliding and global layers of their own heads, and run."""
    path = tmp_path / f"{shape}.gguf"
    make_random_gguf.write(shape, "q4_k_m", path)
    checkpoint = open_checkpoint(path)
    types = {name: t.qtype.name for name, t in checkpoint.tensors.items()}
    assert types["token_embd.weight"] == "Q6_K" and "output.weight" not in types
    assert "blk.5.attn_v.weight" not in types and types["blk.5.attn_k.weight"] == "Q4_K"
    more = [make_random_gguf.use_more_bits(i, 6) for i in range(6)]
    assert [types[f"blk.{i}.ffn_down.weight"] for i in range(6)] == ["Q6_K" if m else "Q4_K" for m in more]
    built = build_model(checkpoint, CpuBackend(), 64)
    cfg = built.config
    assert [cfg.head_dim_of(i) for i in range(6)] == [64] * 5 + [128]
    assert [cfg.kv_heads_of(i) for i in range(6)] == [2] * 5 + [1]
    if shape.endswith("moe"):
        assert cfg.moe is not None and (cfg.moe.num_experts, cfg.moe.num_used) == (4, 2)
        assert types["blk.0.ffn_gate_up_exps.weight"] == "Q4_K"
        # 96-wide rows: the fallbacks of Q4_K (layer 0) and Q6_K (layer 5, a use_more_bits layer)
        assert (types["blk.0.ffn_down_exps.weight"], types["blk.5.ffn_down_exps.weight"]) == ("Q5_0", "Q8_0")
    _runs(path)


def test_random_qwen3moe_in_llama_cpp_q4_k_m_layout(tmp_path: Path) -> None:
    """The Qwen3-30B-A3B-shaped maker's layout at a tiny shape: stacked experts in llama-quantize's Q4_K_M picks,
    the F32 router, the expert counts in the metadata; the engine builds it as a MoE model and runs it."""
    path = tmp_path / "qwen3moe.gguf"
    make_random_gguf.write("tiny-qwen3moe", "q4_k_m", path)
    checkpoint = open_checkpoint(path)
    tensors = checkpoint.tensors
    assert tensors["blk.0.ffn_gate_exps.weight"].shape == (8, 256, 256)
    assert tensors["blk.0.ffn_down_exps.weight"].shape == (8, 256, 256)
    assert tensors["blk.1.ffn_gate_inp.weight"].qtype.name == "F32" and "blk.0.ffn_gate.weight" not in tensors
    more = [make_random_gguf.use_more_bits(i, 2) for i in range(2)]
    assert [tensors[f"blk.{i}.ffn_down_exps.weight"].qtype.name for i in range(2)] == [
        "Q6_K" if m else "Q4_K" for m in more
    ]
    built = build_model(checkpoint, CpuBackend(), 64)
    assert built.config.moe is not None and (built.config.moe.num_experts, built.config.moe.num_used) == (8, 2)
    _runs(path)
    with pytest.raises(ValueError, match="Q4_K_M only"):
        make_random_gguf.write("tiny-qwen3moe", "q8_0", tmp_path / "q8.gguf")


def test_random_gpt_oss_in_llama_cpp_mxfp4_moe_layout(tmp_path: Path) -> None:
    """The GPT-OSS-20B-shaped maker's layout at a tiny shape: MXFP4 experts with F32 biases, Q8_0 elsewhere, the
    sinks and the router's bias; the engine builds it as GPT-OSS (sliding every other layer, YaRN) and runs it."""
    import make_random_gpt_oss_gguf

    path = tmp_path / "gpt-oss.gguf"
    make_random_gpt_oss_gguf.write("gpt-oss-tiny", path)
    checkpoint = open_checkpoint(path)
    types = {name: t.qtype.name for name, t in checkpoint.tensors.items()}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.1.ffn_down_exps.weight"] == "MXFP4"
    assert types["blk.0.attn_q.weight"] == types["output.weight"] == "Q8_0"
    assert types["blk.1.attn_sinks.weight"] == types["blk.1.ffn_down_exps.bias"] == "F32"
    built = build_model(checkpoint, CpuBackend(), 64)
    cfg = built.config
    assert cfg.moe is not None and (cfg.moe.num_experts, cfg.moe.num_used) == (4, 2)
    assert cfg.sliding_window == 16
    _runs(path)
