"""Will-it-fit: exact arithmetic on synthetic shapes, verdict boundaries, shape readers, `paddock fit`."""

from __future__ import annotations

import json
import math

import pytest
from fake_hub import make_tiny_gguf

from app.cli import main as paddock
from app.engine.plan.device import GiB
from app.engine.plan.fit import (
    FITS,
    TIGHT,
    UNKNOWN,
    WONT_FIT,
    DeviceMemory,
    FitOptions,
    ModelShape,
    check_fit,
    cpu_memory,
    shape_from_gguf,
    shape_from_hf_config,
)
from app.engine.plan.memory import CPU_RUNTIME_OVERHEAD_BYTES, CUDA_RUNTIME_OVERHEAD_BYTES, memory

TINY = ModelShape("llama", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=300, context_length=2048, weight_bytes=1_000_000)
LLAMA3_8B_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336,
                    "vocab_size": 128256, "max_position_embeddings": 8192}


def gpu(free: int) -> DeviceMemory:
    return DeviceMemory("cuda", "Test GPU", free, 2 * free)


def test_breakdown_is_the_documented_formula():
    options = FitOptions(context_length=1024, batch=2, kv_dtype="float16", max_num_seqs=32)
    breakdown = memory(TINY, options, "cuda")
    assert breakdown.weights == 1_000_000
    assert breakdown.kv_cache == 2 * 2 * 2 * 16 * 1024 * 2 * 2  # K+V x layers x kv heads x dim x ctx x batch x f16
    step = 1024  # min(max_num_batched_tokens, context)
    per_token = 4 * 64 + (2 * 4 + 2 * 2) * 16 + 3 * 128
    assert breakdown.activations == (step * per_token + 6 * 32 * 300) * 4  # the sampler's six rows of logits
    assert breakdown.overhead == CUDA_RUNTIME_OVERHEAD_BYTES
    assert breakdown.weight_cache == 0  # free memory unknown: no float16 copies are assumed
    assert breakdown.total == 1_000_000 + 524_288 + 3_638_272 + CUDA_RUNTIME_OVERHEAD_BYTES
    # On a GPU with room to spare the CUDA backend keeps float16 copies of the projections.
    copies = 2 * (2 * (2 * 4 * 16 + 2 * 2 * 16 + 3 * 128) * 64 + 300 * 64)
    roomy = memory(TINY, options, "cuda", free_bytes=10 * GiB)
    assert roomy.weight_cache == copies and roomy.total == breakdown.total + copies
    assert memory(TINY, options, "cuda", free_bytes=2 * (1_000_000 + copies) - 1).weight_cache == 0
    assert memory(TINY, options, "cpu", free_bytes=10 * GiB).weight_cache == 0


def test_kv_precision_and_device_defaults():
    llama = shape_from_hf_config(LLAMA3_8B_CONFIG, weight_bytes=16 * GiB)
    at_8k = FitOptions(context_length=8192)
    assert memory(llama, at_8k, "cuda").kv_cache == 1 * GiB  # 128 KiB per token in float16
    # one byte per element plus a float32 scale per (layer, K/V, KV head, 16-token block): 32 x 2 x 8 x 4 x 512
    assert memory(llama, FitOptions(context_length=8192, kv_dtype="fp8"), "cuda").kv_cache == (
        GiB // 2 + 32 * 2 * 8 * 4 * 512
    )
    assert memory(llama, at_8k, "cpu").kv_cache == 2 * GiB  # auto is float32 on the CPU
    assert memory(llama, at_8k, "cpu").overhead == CPU_RUNTIME_OVERHEAD_BYTES
    with pytest.raises(ValueError, match=r"KV dtype must be one of .* not 'int3'"):
        FitOptions(kv_dtype="int3")


def test_verdict_boundaries():
    options = FitOptions(context_length=2048, kv_dtype="float16")
    # every free figure below leaves room for the float16 copies, so each prediction includes them
    total = memory(TINY, options, "cuda", free_bytes=GiB).total
    roomy = math.ceil(total / (0.95 * 0.90)) + 64
    assert check_fit(TINY, options, gpu(roomy)).verdict == FITS
    assert check_fit(TINY, options, gpu(total)).verdict == TIGHT  # over the engine's share, under free memory
    assert check_fit(TINY, options, gpu(total - 1)).verdict == WONT_FIT
    unknown = check_fit(TINY, options, DeviceMemory("cpu", "somewhere", None, None))
    assert unknown.verdict == UNKNOWN and unknown.max_context == 0


def test_largest_context_that_fits_is_exact_in_whole_blocks():
    options = FitOptions(kv_dtype="float16")
    free = 1_000 * 1024 * 1024
    report = check_fit(TINY, options, gpu(free))
    fixed = memory(TINY, FitOptions(context_length=2048, kv_dtype="float16"), "cuda")
    allowed = int(0.95 * int(free * 0.90))
    assert fixed.weight_cache == 0  # predicted without a free figure
    copies = check_fit(TINY, FitOptions(context_length=2048, kv_dtype="float16"), gpu(free)).breakdown.weight_cache
    tokens = (allowed - fixed.weights - copies - fixed.activations - fixed.overhead) // 256  # 256 KV bytes per token
    assert report.max_context == min(tokens, 2048) // 16 * 16

    # A big model on a small GPU: the context is what is left after the weights.
    llama = shape_from_hf_config(LLAMA3_8B_CONFIG, weight_bytes=15 * GiB)
    small = check_fit(llama, FitOptions(kv_dtype="float16"), gpu(20 * GiB))
    fixed = memory(llama, FitOptions(kv_dtype="float16"), "cuda")
    allowed = int(0.95 * int(20 * GiB * 0.90))
    room = allowed - fixed.weights - fixed.activations - fixed.overhead
    assert small.max_context == min(room // (128 * 1024), 8192) // 16 * 16
    assert small.max_context < 8192 and small.verdict == TIGHT  # 8192 tokens exceed the share, not the GPU
    assert check_fit(llama, FitOptions(kv_dtype="float16"), gpu(4 * GiB)).max_context == 0  # weights alone fail


def test_shape_from_gguf_metadata_reads_the_standard_keys():
    meta = {
        "general.architecture": "gemma3", "gemma3.block_count": 18, "gemma3.embedding_length": 640,
        "gemma3.attention.head_count": 4, "gemma3.attention.head_count_kv": 1, "gemma3.attention.key_length": 256,
        "gemma3.attention.value_length": 256, "gemma3.feed_forward_length": 2048, "gemma3.context_length": 32768,
        "tokenizer.ggml.tokens": ["t"] * 262144,
    }
    shape = shape_from_gguf(meta, weight_bytes=246_587_904)
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.vocab_size) == (18, 1, 256, 262144)
    assert shape.kv_bytes_per_token(2) == 18 * 1 * 512 * 2
    per_layer = {**meta, "gemma3.attention.head_count_kv": [1, 2, 1], "gemma3.feed_forward_length": [2048, 4096]}
    assert shape_from_gguf(per_layer, 0).num_kv_heads == 2  # per-layer arrays: the largest counts
    assert shape_from_gguf(per_layer, 0).intermediate_size == 4096
    with pytest.raises(ValueError, match=r"gemma3\.block_count"):
        shape_from_gguf({k: v for k, v in meta.items() if k != "gemma3.block_count"}, 0)


def test_shape_from_hf_config_handles_wrappers_and_experts():
    wrapped = {"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {
        "hidden_size": 2560, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
        "num_hidden_layers": 34, "intermediate_size": 10240, "vocab_size": 262208, "max_position_embeddings": 131072}}
    shape = shape_from_hf_config(wrapped, 1)
    assert (shape.architecture, shape.head_dim, shape.num_layers) == ("Gemma3ForConditionalGeneration", 256, 34)
    moe = {**LLAMA3_8B_CONFIG, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128,
           "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True}  # fmt: skip
    moe_shape = shape_from_hf_config(moe, 1)
    assert (moe_shape.intermediate_size, moe_shape.num_experts, moe_shape.experts_used) == (8 * 768, 128, 8)
    # an architecture the engine has no family for: the keys every decoder shares
    other = shape_from_hf_config({**LLAMA3_8B_CONFIG, "architectures": ["SomeNewForCausalLM"]}, 1)
    assert (other.architecture, other.num_layers, other.num_kv_heads) == ("SomeNewForCausalLM", 32, 8)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        shape_from_hf_config({k: v for k, v in LLAMA3_8B_CONFIG.items() if k != "num_hidden_layers"}, 1)


def test_cpu_memory_reads_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
    memory = cpu_memory(meminfo)
    assert (memory.kind, memory.free_bytes, memory.total_bytes) == ("cpu", 20_000_000 * 1024, 24_000_000 * 1024)
    assert memory.name.startswith("no GPU")


def test_paddock_fit_command_on_a_local_gguf(tmp_path, capsys):
    path = tmp_path / "tiny.gguf"
    make_tiny_gguf(path)
    assert paddock(["fit", str(path), "--ctx", "1024", "--kv-dtype", "f16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["shape"]["num_layers"] == 2 and report["context_length"] == 1024
    assert report["breakdown"]["kv_cache"] == 2 * 2 * 32 * 1024 * 2
    assert report["verdict"] in (FITS, TIGHT, WONT_FIT)
    assert paddock(["fit", str(path)]) == 0
    assert "Largest context that fits" in capsys.readouterr().out
    assert paddock(["fit", str(tmp_path / "missing.gguf"), "--batch", "0"]) == 2
    assert "batch" in capsys.readouterr().err
