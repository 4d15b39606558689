"""Checkpoints that mix the newer formats tensor by tensor, against transformers (logits, every run mode).

tests/fixtures/quant_mix/ (made by tests/fixtures/make_quant_mix_reference.py) holds a tiny Qwen3
twice: a safetensors folder mixing FP8 (128 x 128 `weight_scale_inv` blocks, per-channel BF16 and
per-tensor `weight_scale`), ModelOpt NVFP4 and BF16, and a GGUF mixing MXFP4, IQ4_NL, IQ4_XS,
K-quants and Q8_0. The references are transformers' float32 logits: for the GGUF from its own GGUF
loader, for the folder from the same model with the file's dequantized weights (transformers reads
no such mix). Tolerance as in test_families.py: 1e-5 of the logit scale (float32 summation order).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from model_harness import MODES, run_logits
from test_families import assert_logits_close, assert_same_argmax

from app.engine.backend.cpu import CpuBackend
from app.engine.loader.weights import open_checkpoint
from app.engine.models.decoder import DecoderModel
from app.engine.models.registry import build_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "quant_mix"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))
TOKENS: list[int] = MANIFEST["tokens"]


@functools.cache
def reference(case: str) -> np.ndarray:
    with np.load(FIXTURES / "references.npz") as refs:
        return refs[case]


@functools.cache
def model(case: str) -> DecoderModel:
    checkpoint = open_checkpoint(FIXTURES / MANIFEST["cases"][case]["path"])
    return build_model(checkpoint, CpuBackend(), 64)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["hf", "gguf"])
def test_mixed_checkpoint_matches_transformers(case: str, mode: str) -> None:
    built = model(case)
    ours, expected = run_logits(built, built.backend, TOKENS, mode), reference(case)
    tol = 1e-5 * max(1.0, float(np.abs(expected).max()))
    assert_logits_close(ours, expected, tol, f"quant mix {case} ({mode}) vs transformers")
    assert_same_argmax(ours, expected, f"quant mix {case} ({mode}) vs transformers")


def test_mixed_checkpoints_keep_each_tensor_in_its_format() -> None:
    st = open_checkpoint(FIXTURES / "hf")
    types = {name: t.qtype.name for name, t in st.tensors.items()}
    assert types["blk.0.attn_q.weight"] == "FP8_E4M3" and st.tensors["blk.0.attn_q.weight"].scales.group == (
        128,
        128,
    )
    assert st.tensors["blk.0.attn_k.weight"].scales.group == (1, 256)
    assert st.tensors["blk.0.attn_k.weight"].scales.dtype == "BF16"
    assert st.tensors["blk.0.attn_v.weight"].scales.group == (128, 256)  # one scale: the whole tensor
    nvfp4 = st.tensors["blk.0.attn_output.weight"]
    assert nvfp4.qtype.name == "NVFP4_SPLIT" and nvfp4.shape == (256, 256) and nvfp4.scales.global_scale > 0
    assert types["blk.0.ffn_up.weight"] == "BF16" and types["token_embd.weight"] == "BF16"
    gguf = open_checkpoint(FIXTURES / MANIFEST["cases"]["gguf"]["path"])
    listed = {t["name"]: t["type"] for t in MANIFEST["cases"]["gguf"]["tensors"]}
    assert {name: t.qtype.name for name, t in gguf.tensors.items()} == listed
    assert {"MXFP4", "IQ4_NL", "IQ4_XS", "Q4_K", "Q5_K", "Q6_K", "Q8_0"} <= set(listed.values())
