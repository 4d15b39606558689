"""Random-weight GGUFs of the hybrid Qwen 3.5 models at their real shapes, for the GPU rows beside llama.cpp.

The layout is what llama.cpp's converter writes for `qwen35` / `qwen35moe` (the names and shapes
tests/engine/hybrid_gguf.py derives from transformers' weights, checked there against our loader):
every `full_attention_interval`-th layer is gated attention (attn_q holds the query and its gate, q/k
norms, partial RoPE), the others Gated DeltaNet (attn_qkv, attn_gate = z, ssm_alpha/ssm_beta, the
depthwise ssm_conv1d, ssm_a = -exp(A_log), ssm_dt.bias, the gated ssm_norm, ssm_out); the MoE shape has
256 routed experts stacked per layer plus a gated shared expert. The Q4_K_M mix follows
bench/make_random_gguf.py: Q4_K matrices, Q6_K for attn_v, ssm_out and ffn_down(_exps) on the layers
`use_more_bits` picks and for the output; the small per-head tensors, routers and norms stay F32 as
llama.cpp keeps them.

    python3 bench/make_random_hybrid_gguf.py --shape qwen35-27b --out /tmp/qwen35-27b-q4_k_m.gguf
    python3 bench/make_random_hybrid_gguf.py --shape qwen35-35b-a3b --out /tmp/qwen35-35b-a3b-q4_k_m.gguf
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_random_gguf import (
    add_floats,
    add_random_matrices,
    finish,
    maker_main,
    use_more_bits,
    write_tokenizer,
)


@dataclass(frozen=True)
class HybridShape:
    """A Qwen 3.5 text model's shape (its config.json's text_config)."""

    arch: str  # "qwen35" | "qwen35moe"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    k_heads: int  # linear_num_key_heads
    v_heads: int  # linear_num_value_heads
    k_dim: int  # linear_key_head_dim
    v_dim: int  # linear_value_head_dim
    vocab: int
    ffn: int = 0  # dense MLP width (qwen35)
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    interval: int = 4  # full_attention_interval
    conv_kernel: int = 4
    context: int = 262144
    rope_fraction: float = 0.25

    def is_attention(self, layer: int) -> bool:
        return (layer + 1) % self.interval == 0


# Qwen/Qwen3.5-27B and Qwen/Qwen3.5-35B-A3B (the Qwen 3.6 releases share these architectures).
SHAPES = {
    "qwen35-27b": HybridShape("qwen35", 5120, 64, 24, 4, 256, 16, 48, 128, 128, 248320, ffn=17408),
    "qwen35-35b-a3b": HybridShape(
        "qwen35moe",
        2048,
        40,
        16,
        2,
        256,
        16,
        32,
        128,
        128,
        248320,
        experts=256,
        experts_used=8,
        expert_ffn=512,
        shared_ffn=512,
    ),
    "qwen35-tiny": HybridShape("qwen35", 256, 4, 4, 2, 64, 2, 4, 64, 64, 1024, ffn=512, context=32768),
    "qwen35moe-tiny": HybridShape(
        "qwen35moe",
        256,
        4,
        4,
        2,
        64,
        2,
        4,
        64,
        64,
        1024,
        experts=8,
        experts_used=2,
        expert_ffn=256,
        shared_ffn=256,
        context=4096,
    ),
}


def metadata(s: HybridShape) -> dict[str, int | float | list[int]]:
    meta: dict[str, int | float | list[int]] = {
        "context_length": s.context,
        "embedding_length": s.hidden,
        "block_count": s.layers,
        "attention.head_count": s.heads,
        "attention.head_count_kv": s.kv_heads,
        "attention.key_length": s.head_dim,
        "attention.value_length": s.head_dim,
        "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.freq_base": 10_000_000.0,
        "rope.dimension_count": int(s.head_dim * s.rope_fraction),
        "rope.dimension_sections": [11, 11, 10, 0],
        "ssm.conv_kernel": s.conv_kernel,
        "ssm.state_size": s.k_dim,
        "ssm.group_count": s.k_heads,
        "ssm.time_step_rank": s.v_heads,
        "ssm.inner_size": s.v_dim * s.v_heads,
        "full_attention_interval": s.interval,
    }
    if s.ffn:
        meta["feed_forward_length"] = s.ffn
    if s.experts:
        meta |= {
            "expert_count": s.experts,
            "expert_used_count": s.experts_used,
            "expert_feed_forward_length": s.expert_ffn,
            "expert_shared_feed_forward_length": s.shared_ffn,
        }
    return meta


def matrices(s: HybridShape) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every quantized matrix: GGUF name -> (numpy shape, rows last; quant type)."""
    out: dict[str, tuple[tuple[int, ...], str]] = {
        "token_embd.weight": ((s.vocab, s.hidden), "Q4_K"),
        "output.weight": ((s.vocab, s.hidden), "Q6_K"),
    }
    value_dim = s.v_heads * s.v_dim
    for i in range(s.layers):
        heavy = "Q6_K" if use_more_bits(i, s.layers) else "Q4_K"
        blk = f"blk.{i}"
        if s.is_attention(i):
            out |= {
                f"{blk}.attn_q.weight": ((2 * s.heads * s.head_dim, s.hidden), "Q4_K"),  # query and its gate
                f"{blk}.attn_k.weight": ((s.kv_heads * s.head_dim, s.hidden), "Q4_K"),
                f"{blk}.attn_v.weight": ((s.kv_heads * s.head_dim, s.hidden), heavy),
                f"{blk}.attn_output.weight": ((s.hidden, s.heads * s.head_dim), "Q4_K"),
            }
        else:
            out |= {
                f"{blk}.attn_qkv.weight": ((2 * s.k_heads * s.k_dim + value_dim, s.hidden), "Q4_K"),
                f"{blk}.attn_gate.weight": ((value_dim, s.hidden), "Q4_K"),
                f"{blk}.ssm_out.weight": ((s.hidden, value_dim), heavy),
            }
        if s.experts:
            e = s.experts
            out |= {
                f"{blk}.ffn_gate_exps.weight": ((e, s.expert_ffn, s.hidden), "Q4_K"),
                f"{blk}.ffn_up_exps.weight": ((e, s.expert_ffn, s.hidden), "Q4_K"),
                f"{blk}.ffn_down_exps.weight": ((e, s.hidden, s.expert_ffn), heavy),
                f"{blk}.ffn_gate_shexp.weight": ((s.shared_ffn, s.hidden), "Q4_K"),
                f"{blk}.ffn_up_shexp.weight": ((s.shared_ffn, s.hidden), "Q4_K"),
                f"{blk}.ffn_down_shexp.weight": ((s.hidden, s.shared_ffn), heavy),
            }
        else:
            out |= {
                f"{blk}.ffn_gate.weight": ((s.ffn, s.hidden), "Q4_K"),
                f"{blk}.ffn_up.weight": ((s.ffn, s.hidden), "Q4_K"),
                f"{blk}.ffn_down.weight": ((s.hidden, s.ffn), heavy),
            }
    return out


def small_tensors(s: HybridShape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The F32 tensors: norms near 1, a stable recurrence (decay rates -exp(A_log) in [-2, -0.5]),
    routers and the per-head projections at the matrices' scale."""

    def normal(*shape: int, scale: float) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    def norm(size: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)

    conv_dim = 2 * s.k_heads * s.k_dim + s.v_heads * s.v_dim
    out = {"output_norm.weight": norm(s.hidden)}
    for i in range(s.layers):
        blk = f"blk.{i}"
        out |= {
            f"{blk}.attn_norm.weight": norm(s.hidden),
            f"{blk}.post_attention_norm.weight": norm(s.hidden),
        }
        if s.is_attention(i):
            out |= {
                f"{blk}.attn_q_norm.weight": norm(s.head_dim),
                f"{blk}.attn_k_norm.weight": norm(s.head_dim),
            }
        else:
            out |= {
                f"{blk}.ssm_alpha.weight": normal(s.v_heads, s.hidden, scale=s.hidden**-0.5),
                f"{blk}.ssm_beta.weight": normal(s.v_heads, s.hidden, scale=s.hidden**-0.5),
                f"{blk}.ssm_conv1d.weight": normal(conv_dim, s.conv_kernel, scale=0.5),
                f"{blk}.ssm_a": -rng.uniform(0.5, 2.0, s.v_heads).astype(np.float32),
                f"{blk}.ssm_dt.bias": normal(s.v_heads, scale=0.5),
                f"{blk}.ssm_norm.weight": norm(s.v_dim),
            }
        if s.experts:
            out |= {
                f"{blk}.ffn_gate_inp.weight": normal(s.experts, s.hidden, scale=s.hidden**-0.5),
                f"{blk}.ffn_gate_inp_shexp.weight": normal(s.hidden, scale=s.hidden**-0.5),
            }
    return out


def write(shape_name: str, out: Path, seed: int = 0) -> int:
    s = SHAPES[shape_name]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), s.arch)
    writer.add_name(f"random-{shape_name}-q4_k_m")
    for key, value in metadata(s).items():
        full = f"{s.arch}.{key}"
        if isinstance(value, list):
            writer.add_array(full, value)
        elif isinstance(value, float):
            writer.add_float32(full, value)
        else:
            writer.add_uint32(full, value)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    write_tokenizer(writer, s.vocab)
    table = matrices(s)
    nbytes = add_random_matrices(writer, {n: dims for n, (dims, _) in table.items()},
                                 {n: kind for n, (_, kind) in table.items()}, rng)  # fmt: skip
    nbytes += add_floats(writer, small_tensors(s, rng))
    finish(writer)
    return nbytes


if __name__ == "__main__":
    maker_main(__doc__, SHAPES, write)
