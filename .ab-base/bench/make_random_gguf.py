"""Random-weight GGUF checkpoints at real model shapes, for GPU benchmarks.

The weights are random quantized blocks (app.engine.quant.reference.random_blocks), laid
out as llama.cpp lays out a Q4_K_M file: Q4_K for the attention q/k/o, gate, up and the
embedding table; Q6_K for the output projection, and for attn_v and ffn_down on the
layers llama.cpp's `use_more_bits` picks (else Q4_K); F32 norms. `--mix q8_0` makes every
matrix Q8_0 instead; `--mix mxfp4` makes every layer matrix MXFP4 (Q8_0 embedding, Q6_K output,
as llama.cpp's MXFP4_MOE keeps the non-expert tensors in 8 bits; `nvfp4` the same with GGUF's NVFP4); `--mix iq4_xs` is a "dynamic"
mix as Unsloth's UD files are: IQ4_XS layer matrices, Q6_K on the `use_more_bits` layers' attn_v
and ffn_down and on the output, Q4_K embedding. The tokenizer is byte-level BPE with no merges (one token per byte),
padded with plain word tokens to the model's vocabulary, so every sampled id decodes to
visible text.

    python3 bench/make_random_gguf.py --shape qwen3-8b --mix q4_k_m --out /tmp/qwen3-8b-q4km.gguf
    python3 bench/make_random_gguf.py --shape llama3-8b --mix q8_0 --out /tmp/llama3-8b-q8_0.gguf
    python3 bench/make_random_gguf.py --shape qwen3-8b --mix mxfp4 --out /tmp/qwen3-8b-mxfp4.gguf

The `gemma4-*` shapes are written in llama.cpp's `gemma4` layout (Q4_K_M only, as llama-quantize makes
it: see `gemma4_tensor_types`): sliding layers and global layers with 512-wide heads, keys as values on the
global layers (no attn_v), proportional RoPE as `rope_freqs`, the experts beside the MLP stacked as
`ffn_gate_up_exps` / `ffn_down_exps` with their router scales, so llama.cpp's llama-server loads them too.

    python3 bench/make_random_gguf.py --shape gemma4-31b --out /tmp/gemma4-31b-q4km.gguf

`qwen3-30b-a3b` is `qwen3moe` (Q4_K_M only): the experts stacked as `ffn_{gate,up,down}_exps`
`[experts, rows, cols]` with llama-quantize's picks (Q4_K; Q6_K on the `use_more_bits` layers'
`ffn_down_exps`), the router `ffn_gate_inp` kept F32.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.loader.tokenizer import bytes_to_unicode
from app.engine.quant.reference import random_blocks
from app.engine.quant.types import QUANT_TYPES


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    context: int
    tied: bool
    arch: str = "qwen3"  # "llama": no q/k norms, rope base 500,000; "qwen3moe": experts instead of the MLP
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0


SHAPES = {
    "qwen3-8b": Shape(4096, 36, 32, 8, 128, 12288, 151936, 40960, tied=False),
    "qwen3-4b": Shape(2560, 36, 32, 8, 128, 9728, 151936, 40960, tied=True),
    "qwen3-0.6b": Shape(1024, 28, 16, 8, 128, 3072, 151936, 40960, tied=True),
    "llama3-8b": Shape(4096, 32, 32, 8, 128, 14336, 128256, 8192, tied=False, arch="llama"),
    "tiny": Shape(256, 2, 4, 2, 64, 512, 1024, 4096, tied=False),
    "tiny-llama": Shape(256, 2, 4, 2, 64, 512, 1024, 4096, tied=False, arch="llama"),
    # Qwen/Qwen3-30B-A3B's config.json: 128 experts, 8 a token, 768 wide (issue 38's formats row)
    "qwen3-30b-a3b": Shape(2048, 48, 32, 4, 128, 6144, 151936, 40960, tied=False, arch="qwen3moe", experts=128,
                           experts_used=8, expert_ffn=768),
    "tiny-qwen3moe": Shape(256, 2, 4, 2, 64, 512, 1024, 4096, tied=False, arch="qwen3moe", experts=8,
                           experts_used=2, expert_ffn=256),
}


@dataclass(frozen=True)
class Gemma4Shape:
    """Gemma 4's text decoder: five sliding layers (`head_dim`, `kv_heads`) to one global layer
    (`global_head_dim`, `global_kv_heads`, values from the keys), tied embeddings, optional experts."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    global_kv_heads: int
    global_head_dim: int
    ffn: int
    vocab: int
    context: int
    window: int
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    tied: bool = True
    arch: str = "gemma4"

    def is_sliding(self, layer: int) -> bool:
        return (layer + 1) % 6 != 0

    def geometry(self, layer: int) -> tuple[int, int]:
        """(KV heads, head dim) of the layer."""
        if self.is_sliding(layer):
            return self.kv_heads, self.head_dim
        return self.global_kv_heads, self.global_head_dim


# The published config.json files (google/gemma-4-31B, google/gemma-4-26B-A4B: text_config); the tiny ones
# for the tests (this script's, and the GPU suite's Gemma 4 on the kernels real heads take).
GEMMA4_SHAPES = {
    "gemma4-31b": Gemma4Shape(5376, 60, 32, 16, 256, 4, 512, 21504, 262144, 262144, 1024),
    "gemma4-26b-a4b": Gemma4Shape(2816, 30, 16, 8, 256, 2, 512, 2112, 262144, 262144, 1024, 128, 8, 704),
    "gemma4-tiny": Gemma4Shape(256, 6, 4, 2, 64, 1, 128, 512, 1024, 4096, 16),
    "gemma4-tiny-moe": Gemma4Shape(256, 6, 4, 2, 64, 1, 128, 512, 1024, 4096, 16, 4, 2, 96),
    "gemma4-tiny-wide": Gemma4Shape(256, 6, 8, 4, 64, 1, 512, 512, 1024, 4096, 16),  # 31B's 512-wide global heads
}
GEMMA4_ROPE_FRACTION = 0.25  # the global layers' proportional RoPE: a quarter of the pairs rotate
GEMMA4_SOFTCAP = 30.0


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get Q6_K in Q4_K_M."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


# mix -> (plain layer matrix, use_more_bits layers' attn_v/ffn_down, token_embd, output, file type)
MIXES = {
    "q4_k_m": ("Q4_K", "Q6_K", "Q4_K", "Q6_K", gguf.LlamaFileType.MOSTLY_Q4_K_M),
    "q8_0": ("Q8_0", "Q8_0", "Q8_0", "Q8_0", gguf.LlamaFileType.MOSTLY_Q8_0),
    "mxfp4": ("MXFP4", "MXFP4", "Q8_0", "Q6_K", gguf.LlamaFileType.MOSTLY_MXFP4_MOE),
    "nvfp4": ("NVFP4", "NVFP4", "Q8_0", "Q6_K", gguf.LlamaFileType.MOSTLY_NVFP4),
    "iq4_xs": ("IQ4_XS", "Q6_K", "Q4_K", "Q6_K", gguf.LlamaFileType.MOSTLY_IQ4_XS),
}


def tensor_types(shape: Shape, mix: str) -> dict[str, str]:
    if mix != "q4_k_m":
        if shape.experts:
            raise ValueError(f"the MoE shapes are written as Q4_K_M only, not --mix {mix}")
        plain, more, embd, output, _ = MIXES[mix]
        out = {}
        for i in range(shape.layers):
            heavy = more if use_more_bits(i, shape.layers) else plain
            for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
                out[f"blk.{i}.{part}.weight"] = heavy if part in ("attn_v", "ffn_down") else plain
        out["token_embd.weight"] = embd
        if not shape.tied:
            out["output.weight"] = output
        return out
    out: dict[str, str] = {}
    ffn = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps") if shape.experts else ("ffn_gate", "ffn_up", "ffn_down")
    for i in range(shape.layers):
        heavy = "Q6_K" if use_more_bits(i, shape.layers) else "Q4_K"
        for part, kind in [("attn_q", "Q4_K"), ("attn_k", "Q4_K"), ("attn_v", heavy), ("attn_output", "Q4_K"),
                           (ffn[0], "Q4_K"), (ffn[1], "Q4_K"), (ffn[2], heavy)]:  # fmt: skip
            out[f"blk.{i}.{part}.weight"] = kind if mix == "q4_k_m" else "Q8_0"
    out["token_embd.weight"] = "Q4_K" if mix == "q4_k_m" else "Q8_0"
    if not shape.tied:
        out["output.weight"] = "Q6_K" if mix == "q4_k_m" else "Q8_0"
    return out


def matrix_shapes(shape: Shape) -> dict[str, tuple[int, ...]]:
    """Every quantized matrix: `(rows, cols)`, or `(experts, rows, cols)` stacked as llama.cpp's `*_exps`."""
    s = shape
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (s.vocab, s.hidden)}
    if not s.tied:
        out["output.weight"] = (s.vocab, s.hidden)
    for i in range(s.layers):
        out |= {
            f"blk.{i}.attn_q.weight": (s.heads * s.head_dim, s.hidden),
            f"blk.{i}.attn_k.weight": (s.kv_heads * s.head_dim, s.hidden),
            f"blk.{i}.attn_v.weight": (s.kv_heads * s.head_dim, s.hidden),
            f"blk.{i}.attn_output.weight": (s.hidden, s.heads * s.head_dim),
        }
        if s.experts:
            out |= {
                f"blk.{i}.ffn_gate_exps.weight": (s.experts, s.expert_ffn, s.hidden),
                f"blk.{i}.ffn_up_exps.weight": (s.experts, s.expert_ffn, s.hidden),
                f"blk.{i}.ffn_down_exps.weight": (s.experts, s.hidden, s.expert_ffn),
            }
        else:
            out |= {
                f"blk.{i}.ffn_gate.weight": (s.ffn, s.hidden),
                f"blk.{i}.ffn_up.weight": (s.ffn, s.hidden),
                f"blk.{i}.ffn_down.weight": (s.hidden, s.ffn),
            }
    return out


def write_tokenizer(writer: gguf.GGUFWriter, vocab: int) -> None:
    byte_char = bytes_to_unicode()
    chars = [byte_char[b] for b in range(256)]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    # "Ġw" and the merge that makes it: llama.cpp refuses a gpt2 vocabulary without merges (and the tokenizers
    # library a merge whose parts or result are not tokens)
    words = ["Ġw"] + [f"Ġw{i}" for i in range(vocab - 257 - len(specials))]
    tokens = chars + words + specials
    types = [gguf.TokenType.NORMAL] * (256 + len(words)) + [gguf.TokenType.CONTROL] * len(specials)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["Ġ w"])
    writer.add_eos_token_id(vocab - 1)  # <|im_end|>
    writer.add_bos_token_id(vocab - 3)
    writer.add_add_bos_token(False)


def k_quant_or_fallback(kind: str, cols: int) -> str:
    """llama.cpp's `tensor_type_fallback`: a K-quant whose 256-weight blocks do not tile a row takes
    the 32-weight format it names (Q4_K -> Q5_0, Q6_K -> Q8_0)."""
    if cols % 256 == 0:
        return kind
    return {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[kind]


def gemma4_matrices(shape: Gemma4Shape) -> dict[str, tuple[int, ...]]:
    """Every quantized matrix of the Gemma 4 layout: `(rows, cols)`, or `(experts, rows, cols)` stacked."""
    s = shape
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (s.vocab, s.hidden)}
    for i in range(s.layers):
        kv, dim = s.geometry(i)
        p = f"blk.{i}"
        out[f"{p}.attn_q.weight"] = (s.heads * dim, s.hidden)
        out[f"{p}.attn_k.weight"] = (kv * dim, s.hidden)
        if s.is_sliding(i):  # the global layers' values are their keys (attention_k_eq_v)
            out[f"{p}.attn_v.weight"] = (kv * dim, s.hidden)
        out[f"{p}.attn_output.weight"] = (s.hidden, s.heads * dim)
        out |= {f"{p}.ffn_gate.weight": (s.ffn, s.hidden), f"{p}.ffn_up.weight": (s.ffn, s.hidden),
                f"{p}.ffn_down.weight": (s.hidden, s.ffn)}  # fmt: skip
        if s.experts:
            out[f"{p}.ffn_gate_up_exps.weight"] = (s.experts, 2 * s.expert_ffn, s.hidden)
            out[f"{p}.ffn_down_exps.weight"] = (s.experts, s.hidden, s.expert_ffn)
    return out


def gemma4_tensor_types(shape: Gemma4Shape) -> dict[str, str]:
    """llama-quantize's Q4_K_M choices for Gemma 4 (src/llama-quant.cpp): the tied embedding as the output
    (Q6_K); attn_v Q6_K on the `use_more_bits` picks among the attn_v tensors (the sliding layers'), ffn_down
    and ffn_down_exps on those layers; Q4_K elsewhere; rows that 256-weight blocks do not tile fall back."""
    types, n_values = {}, sum(shape.is_sliding(i) for i in range(shape.layers))
    values_seen = 0
    for name, dims in gemma4_matrices(shape).items():
        kind = "Q4_K"
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        if name == "token_embd.weight":
            kind = "Q6_K"
        elif ".attn_v." in name:
            kind = "Q6_K" if use_more_bits(values_seen, n_values) else "Q4_K"
            values_seen += 1
        elif ".ffn_down" in name and use_more_bits(layer, shape.layers):
            kind = "Q6_K"
        types[name] = k_quant_or_fallback(kind, dims[-1])
    return types


def gemma4_vectors(shape: Gemma4Shape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The float32 tensors: norms (plain `w`, near 1), layer output scales, proportional RoPE's factors
    (1 for the rotated pairs, 1e30 for the rest, as llama.cpp's converter writes them), router scales."""
    s = shape

    def norm(size: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)

    rotated = int(s.global_head_dim * GEMMA4_ROPE_FRACTION) // 2
    out = {
        "rope_freqs.weight": np.array([1.0] * rotated + [1e30] * (s.global_head_dim // 2 - rotated), np.float32),
        "output_norm.weight": norm(s.hidden),
    }
    for i in range(s.layers):
        p, dim = f"blk.{i}", s.geometry(i)[1]
        for part in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            out[f"{p}.{part}.weight"] = norm(s.hidden)
        out |= {f"{p}.attn_q_norm.weight": norm(dim), f"{p}.attn_k_norm.weight": norm(dim),
                f"{p}.layer_output_scale.weight": np.ones(1, np.float32)}  # fmt: skip
        if s.experts:
            for part in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                out[f"{p}.{part}.weight"] = norm(s.hidden)
            out[f"{p}.ffn_gate_inp.weight"] = (rng.standard_normal((s.experts, s.hidden)) * s.hidden**-0.5).astype(
                np.float32
            )  # the router stays float (llama-quantize skips ffn_gate_inp)
            out[f"{p}.ffn_gate_inp.scale"] = norm(s.hidden)
            out[f"{p}.ffn_down_exps.scale"] = norm(s.experts)
    return out


def write_gemma4_metadata(writer: gguf.GGUFWriter, shape: Gemma4Shape) -> None:
    s = shape
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.hidden)
    writer.add_block_count(s.layers)
    writer.add_feed_forward_length(s.ffn)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv([s.geometry(i)[0] for i in range(s.layers)])
    writer.add_key_length(s.global_head_dim)
    writer.add_value_length(s.global_head_dim)
    writer.add_key_length_swa(s.head_dim)
    writer.add_value_length_swa(s.head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_rope_freq_base_swa(10_000.0)
    writer.add_rope_dimension_count(s.global_head_dim)
    writer.add_rope_dimension_count_swa(s.head_dim)
    writer.add_sliding_window(s.window)
    writer.add_sliding_window_pattern([s.is_sliding(i) for i in range(s.layers)])
    writer.add_shared_kv_layers(0)
    writer.add_embedding_length_per_layer_input(0)
    writer.add_final_logit_softcapping(GEMMA4_SOFTCAP)
    if s.experts:
        writer.add_expert_count(s.experts)
        writer.add_expert_used_count(s.experts_used)
        writer.add_expert_feed_forward_length(s.expert_ffn)
    writer.add_vocab_size(s.vocab)


def write_gemma4(shape: Gemma4Shape, writer: gguf.GGUFWriter, rng: np.random.Generator) -> int:
    """The metadata and tensors of a Gemma 4 checkpoint into `writer`; the weight bytes."""
    write_gemma4_metadata(writer, shape)
    nbytes = add_random_matrices(writer, gemma4_matrices(shape), gemma4_tensor_types(shape), rng)
    return nbytes + add_floats(writer, gemma4_vectors(shape, rng))


def write(shape_name: str, mix: str, out: Path, seed: int = 0) -> int:
    if shape_name in GEMMA4_SHAPES:
        if mix != "q4_k_m":
            raise ValueError(f"--shape {shape_name} is written as Q4_K_M only, not --mix {mix}")
        shape4, rng = GEMMA4_SHAPES[shape_name], np.random.default_rng(seed)
        writer = gguf.GGUFWriter(str(out), "gemma4")
        writer.add_name(f"random-{shape_name}-{mix}")
        writer.add_file_type(MIXES[mix][4])
        write_tokenizer(writer, shape4.vocab)
        weight_bytes = write_gemma4(shape4, writer, rng)
        finish(writer)
        return weight_bytes
    shape = SHAPES[shape_name]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), shape.arch)
    writer.add_name(f"random-{shape_name}-{mix}")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(500_000.0 if shape.arch == "llama" else 1_000_000.0)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_file_type(MIXES[mix][4])
    if shape.experts:
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.expert_ffn)
    write_tokenizer(writer, shape.vocab)
    weight_bytes = add_random_matrices(writer, matrix_shapes(shape), tensor_types(shape, mix), rng)
    # the MoE router stays F32, as llama-quantize keeps it
    floats = {
        f"blk.{i}.ffn_gate_inp.weight": (rng.standard_normal((shape.experts, shape.hidden)) * shape.hidden**-0.5).astype(np.float32)
        for i in range(shape.layers if shape.experts else 0)
    }  # fmt: skip
    norms = {"output_norm.weight": shape.hidden}
    for i in range(shape.layers):
        norms |= {f"blk.{i}.attn_norm.weight": shape.hidden, f"blk.{i}.ffn_norm.weight": shape.hidden}
        if shape.arch in ("qwen3", "qwen3moe"):
            norms |= {
                f"blk.{i}.attn_q_norm.weight": shape.head_dim,
                f"blk.{i}.attn_k_norm.weight": shape.head_dim,
            }
    floats |= {name: (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32) for name, size in norms.items()}
    weight_bytes += add_floats(writer, floats)
    finish(writer)
    return weight_bytes


def add_random_matrices(
    writer: gguf.GGUFWriter, matrices: dict[str, tuple[int, ...]], types: dict[str, str], rng: np.random.Generator
) -> int:
    """Each of `matrices` (`(rows, cols)`, or `(experts, rows, cols)` stacked) as random blocks of its format in
    `types` into `writer`; their bytes."""
    nbytes = 0
    for name, dims in matrices.items():
        qtype = QUANT_TYPES[types[name]]
        # Scale ~ 1/sqrt(fan-in) keeps activations O(1) through the layers.
        blocks = random_blocks(qtype, int(np.prod(dims)) // qtype.block_size, rng, scale=dims[-1] ** -0.5)
        writer.add_tensor(name, blocks.reshape(*dims[:-1], -1), raw_dtype=gguf.GGMLQuantizationType[qtype.name])
        nbytes += blocks.nbytes
    return nbytes


def add_floats(writer: gguf.GGUFWriter, tensors: dict[str, np.ndarray]) -> int:
    """The float32 tensors as they are; their bytes."""
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    return sum(values.nbytes for values in tensors.values())


def finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def maker_main(doc: str, shapes: dict, write: Callable[[str, Path], int]) -> None:
    """The command line of a maker with one mix: --shape (of `shapes`), --out, --layers."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(shapes), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--layers", type=int, help="fewer layers than the real model (kernel profiles: same per-layer cost)"
    )
    args = parser.parse_args()
    if args.layers:
        shapes[args.shape] = replace(shapes[args.shape], layers=args.layers)
    started = time.perf_counter()
    nbytes = write(args.shape, args.out)
    print(f"{args.out}: {nbytes / 1e9:.2f} GB of weights in {time.perf_counter() - started:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES) + sorted(GEMMA4_SHAPES), required=True)
    parser.add_argument("--mix", choices=sorted(MIXES), default="q4_k_m")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--layers", type=int, help="fewer layers than the real model (kernel profiles: same per-layer cost)"
    )
    args = parser.parse_args()
    if args.layers:
        table = GEMMA4_SHAPES if args.shape in GEMMA4_SHAPES else SHAPES
        table[args.shape] = replace(table[args.shape], layers=args.layers)
    started = time.perf_counter()
    nbytes = write(args.shape, args.mix, args.out)
    print(f"{args.out}: {nbytes / 1e9:.2f} GB of weights in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
