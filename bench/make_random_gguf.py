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
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
    arch: str = "qwen3"  # "llama": no q/k norms, rope base 500,000


SHAPES = {
    "qwen3-8b": Shape(4096, 36, 32, 8, 128, 12288, 151936, 40960, tied=False),
    "qwen3-4b": Shape(2560, 36, 32, 8, 128, 9728, 151936, 40960, tied=True),
    "qwen3-0.6b": Shape(1024, 28, 16, 8, 128, 3072, 151936, 40960, tied=True),
    "llama3-8b": Shape(4096, 32, 32, 8, 128, 14336, 128256, 8192, tied=False, arch="llama"),
    "tiny": Shape(256, 2, 4, 2, 64, 512, 1024, 4096, tied=False),
    "tiny-llama": Shape(256, 2, 4, 2, 64, 512, 1024, 4096, tied=False, arch="llama"),
}


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
    for i in range(shape.layers):
        heavy = "Q6_K" if use_more_bits(i, shape.layers) else "Q4_K"
        for part, kind in [("attn_q", "Q4_K"), ("attn_k", "Q4_K"), ("attn_v", heavy), ("attn_output", "Q4_K"),
                           ("ffn_gate", "Q4_K"), ("ffn_up", "Q4_K"), ("ffn_down", heavy)]:  # fmt: skip
            out[f"blk.{i}.{part}.weight"] = kind if mix == "q4_k_m" else "Q8_0"
    out["token_embd.weight"] = "Q4_K" if mix == "q4_k_m" else "Q8_0"
    if not shape.tied:
        out["output.weight"] = "Q6_K" if mix == "q4_k_m" else "Q8_0"
    return out


def matrix_shapes(shape: Shape) -> dict[str, tuple[int, int]]:
    s = shape
    out = {"token_embd.weight": (s.vocab, s.hidden)}
    if not s.tied:
        out["output.weight"] = (s.vocab, s.hidden)
    for i in range(s.layers):
        out |= {
            f"blk.{i}.attn_q.weight": (s.heads * s.head_dim, s.hidden),
            f"blk.{i}.attn_k.weight": (s.kv_heads * s.head_dim, s.hidden),
            f"blk.{i}.attn_v.weight": (s.kv_heads * s.head_dim, s.hidden),
            f"blk.{i}.attn_output.weight": (s.hidden, s.heads * s.head_dim),
            f"blk.{i}.ffn_gate.weight": (s.ffn, s.hidden),
            f"blk.{i}.ffn_up.weight": (s.ffn, s.hidden),
            f"blk.{i}.ffn_down.weight": (s.hidden, s.ffn),
        }
    return out


def write_tokenizer(writer: gguf.GGUFWriter, vocab: int) -> None:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    words = [f"Ġw{i}" for i in range(vocab - 256 - len(specials))]
    tokens = chars + words + specials
    types = [gguf.TokenType.NORMAL] * (256 + len(words)) + [gguf.TokenType.CONTROL] * len(specials)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([])
    writer.add_eos_token_id(vocab - 1)  # <|im_end|>
    writer.add_bos_token_id(vocab - 3)
    writer.add_add_bos_token(False)


def write(shape_name: str, mix: str, out: Path, seed: int = 0) -> int:
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
    write_tokenizer(writer, shape.vocab)
    types = tensor_types(shape, mix)
    weight_bytes = 0
    for name, (rows, cols) in matrix_shapes(shape).items():
        qtype = QUANT_TYPES[types[name]]
        # Scale ~ 1/sqrt(fan-in) keeps activations O(1) through the layers.
        blocks = random_blocks(qtype, rows * cols // qtype.block_size, rng, scale=cols**-0.5)
        writer.add_tensor(name, blocks.reshape(rows, -1), raw_dtype=gguf.GGMLQuantizationType[qtype.name])
        weight_bytes += blocks.nbytes
    norms = {"output_norm.weight": shape.hidden}
    for i in range(shape.layers):
        norms |= {f"blk.{i}.attn_norm.weight": shape.hidden, f"blk.{i}.ffn_norm.weight": shape.hidden}
        if shape.arch == "qwen3":
            norms |= {
                f"blk.{i}.attn_q_norm.weight": shape.head_dim,
                f"blk.{i}.attn_k_norm.weight": shape.head_dim,
            }
    for name, size in norms.items():
        values = (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)
        writer.add_tensor(name, values)
        weight_bytes += values.nbytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weight_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--mix", choices=sorted(MIXES), default="q4_k_m")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    nbytes = write(args.shape, args.mix, args.out)
    print(f"{args.out}: {nbytes / 1e9:.2f} GB of weights in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
