"""Random-weight GPT-OSS checkpoints in llama.cpp's `gpt-oss` GGUF layout, for GPU benchmarks.

The layout is what llama.cpp's converter and llama-quantize's MXFP4_MOE make of openai/gpt-oss-20b: the
experts' gate, up and down stacked as `ffn_{gate,up,down}_exps [experts, rows, cols]` in MXFP4 with F32 biases,
every other matrix Q8_0, the attention's biases and per-head sinks (`attn_sinks`), the router
`ffn_gate_inp` with its bias in F32, YaRN RoPE and a 128-token window on every other layer (llama.cpp sets
the pattern itself). The weights are random quantized blocks (app.engine.quant.reference.random_blocks);
the tokenizer is make_random_gguf.py's byte-level one.

    python3 bench/make_random_gpt_oss_gguf.py --shape gpt-oss-20b --out /tmp/gpt-oss-20b-mxfp4.gguf
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_random_gguf import add_floats, add_random_matrices, finish, maker_main, write_tokenizer


@dataclass(frozen=True)
class GptOssShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    experts_used: int
    expert_ffn: int
    vocab: int
    context: int
    window: int
    yarn_factor: float
    yarn_original_context: int


# openai/gpt-oss-20b's config.json; the tiny one for the tests
SHAPES = {
    "gpt-oss-20b": GptOssShape(2880, 24, 64, 8, 64, 32, 4, 2880, 201088, 131072, 128, 32.0, 4096),
    "gpt-oss-tiny": GptOssShape(256, 2, 4, 2, 64, 4, 2, 256, 1024, 4096, 16, 32.0, 256),
}
EXPERT_FORMAT = "MXFP4"
OTHER_FORMAT = "Q8_0"  # llama-quantize's MXFP4_MOE keeps the rest in 8 bits


def matrices(shape: GptOssShape) -> dict[str, tuple[int, ...]]:
    """Every quantized matrix: `(rows, cols)`, or `(experts, rows, cols)` stacked."""
    s = shape
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (s.vocab, s.hidden), "output.weight": (s.vocab, s.hidden)}
    for i in range(s.layers):
        p = f"blk.{i}"
        out |= {f"{p}.attn_q.weight": (q, s.hidden), f"{p}.attn_k.weight": (kv, s.hidden),
                f"{p}.attn_v.weight": (kv, s.hidden), f"{p}.attn_output.weight": (s.hidden, q),
                f"{p}.ffn_gate_exps.weight": (s.experts, s.expert_ffn, s.hidden),
                f"{p}.ffn_up_exps.weight": (s.experts, s.expert_ffn, s.hidden),
                f"{p}.ffn_down_exps.weight": (s.experts, s.hidden, s.expert_ffn)}  # fmt: skip
    return out


def vectors(shape: GptOssShape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The F32 tensors: norms near 1, small biases, the sinks, the router and its bias."""
    s = shape
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim

    def small(*dims: int) -> np.ndarray:
        return (0.02 * rng.standard_normal(dims)).astype(np.float32)

    out = {"output_norm.weight": (1.0 + small(s.hidden)).astype(np.float32)}
    for i in range(s.layers):
        p = f"blk.{i}"
        out |= {
            f"{p}.attn_norm.weight": (1.0 + small(s.hidden)).astype(np.float32),
            f"{p}.post_attention_norm.weight": (1.0 + small(s.hidden)).astype(np.float32),
            f"{p}.attn_q.bias": small(q), f"{p}.attn_k.bias": small(kv), f"{p}.attn_v.bias": small(kv),
            f"{p}.attn_output.bias": small(s.hidden),
            f"{p}.attn_sinks.weight": rng.standard_normal(s.heads).astype(np.float32),
            f"{p}.ffn_gate_inp.weight": (rng.standard_normal((s.experts, s.hidden)) * s.hidden**-0.5).astype(np.float32),
            f"{p}.ffn_gate_inp.bias": small(s.experts),
            f"{p}.ffn_gate_exps.bias": small(s.experts, s.expert_ffn),
            f"{p}.ffn_up_exps.bias": small(s.experts, s.expert_ffn),
            f"{p}.ffn_down_exps.bias": small(s.experts, s.hidden),
        }  # fmt: skip
    return out


def write(shape_name: str, out: Path, seed: int = 0) -> int:
    """The checkpoint of `shape_name` at `out`; the weight bytes."""
    s, rng = SHAPES[shape_name], np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), "gpt-oss")
    writer.add_name(f"random-{shape_name}-mxfp4")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.hidden)
    writer.add_block_count(s.layers)
    writer.add_feed_forward_length(s.expert_ffn)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv(s.kv_heads)
    writer.add_key_length(s.head_dim)
    writer.add_value_length(s.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(150_000.0)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(s.yarn_factor)
    writer.add_rope_scaling_orig_ctx_len(s.yarn_original_context)
    writer.add_sliding_window(s.window)
    writer.add_expert_count(s.experts)
    writer.add_expert_used_count(s.experts_used)
    writer.add_expert_feed_forward_length(s.expert_ffn)
    write_tokenizer(writer, s.vocab)
    types = {name: EXPERT_FORMAT if "_exps" in name else OTHER_FORMAT for name in matrices(s)}
    nbytes = add_random_matrices(writer, matrices(s), types, rng)
    nbytes += add_floats(writer, vectors(s, rng))
    finish(writer)
    return nbytes


if __name__ == "__main__":
    maker_main(__doc__, SHAPES, write)
