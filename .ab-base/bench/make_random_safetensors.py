"""Random-weight Hugging Face safetensors checkpoints at real model shapes, quantized as vendors ship them.

A folder with config.json, model-0000N-of-0000M.safetensors shards (about 5 GB each, with their
index), tokenizer.json and tokenizer_config.json. Layer matrices are random codes with scales
(app.engine.quant.split.random_split) in one of these layouts; embeddings and the head stay BF16
and norms F32, as in the published FP8/NVFP4 checkpoints:

- `fp8-block`: float8_e4m3fn weights + 128 x 128 float32 `weight_scale_inv` (Qwen3-8B-FP8's layout,
  `quantization_config.weight_block_size`);
- `nvfp4`: ModelOpt NVFP4, packed e2m1 `weight` + e4m3 `weight_scale` per 16 + `weight_scale_2`;
- `mix`: per layer, q/k/v and gate/up FP8 blocks, o and down NVFP4, every fourth layer's MLP BF16:
  every kernel path in one model.

The tokenizer is the byte-level BPE of make_random_gguf.py (one token per byte, padded with words).

    python3 bench/make_random_safetensors.py --shape qwen3-8b --format fp8-block --out /tmp/qwen3-8b-fp8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_random_gguf import SHAPES, Shape, matrix_shapes

from app.engine.loader.safetensors_write import StoredTensor, write_safetensors
from app.engine.quant.split import random_split
from app.engine.quant.types import QUANT_TYPES

SHARD_BYTES = 5 << 30
_HF_MODULES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}  # fmt: skip


def hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    _, layer, module, _ = gguf_name.split(".")
    return f"model.layers.{layer}.{_HF_MODULES[module]}.weight"


def storage(fmt: str, gguf_name: str) -> str:
    """BF16, FP8_E4M3 or NVFP4_SPLIT for one matrix under `fmt`."""
    if not gguf_name.startswith("blk."):
        return "BF16"
    if fmt == "fp8-block":
        return "FP8_E4M3"
    if fmt == "nvfp4":
        return "NVFP4_SPLIT"
    layer, module = int(gguf_name.split(".")[1]), gguf_name.split(".")[2]
    if layer % 4 == 3 and module.startswith("ffn"):
        return "BF16"
    return "NVFP4_SPLIT" if module in ("attn_output", "ffn_down") else "FP8_E4M3"


def matrix_tensors(
    name: str, kind: str, rows: int, cols: int, rng: np.random.Generator
) -> dict[str, StoredTensor]:
    scale = cols**-0.5  # ~ 1/sqrt(fan-in): activations stay O(1) through the layers
    if kind == "BF16":

        def bf16() -> np.ndarray:
            values = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(scale)
            return (values.view(np.uint32) >> 16).astype(np.uint16)

        return {name: StoredTensor("BF16", (rows, cols), bf16)}
    codes, scales, _, _, global_scale = random_split(QUANT_TYPES[kind], rows, cols, rng, scale)
    if kind == "FP8_E4M3":
        return {
            name: StoredTensor("F8_E4M3", codes.shape, codes),
            f"{name}_scale_inv": StoredTensor("F32", scales.shape, scales),
        }
    return {
        name: StoredTensor("U8", codes.shape, codes),
        f"{name}_scale": StoredTensor("F8_E4M3", scales.shape, scales),
        f"{name}_scale_2": StoredTensor("F32", (), np.array(global_scale, np.float32)),
        name.removesuffix("weight") + "input_scale": StoredTensor("F32", (), np.array(1.0, np.float32)),
    }


def config_json(shape: Shape, fmt: str) -> dict:
    quant = (
        {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        }
        if fmt != "nvfp4"
        else {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    )
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": shape.vocab,
        "hidden_size": shape.hidden, "intermediate_size": shape.ffn, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
        "max_position_embeddings": shape.context, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": shape.tied, "torch_dtype": "bfloat16", "bos_token_id": shape.vocab - 3,
        "eos_token_id": shape.vocab - 1, "quantization_config": quant,
    }  # fmt: skip


def write_tokenizer(folder: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = sorted(byte_chars) + [f"Ġw{i}" for i in range(vocab - 256 - len(specials))]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "bos_token": None, "add_bos_token": False, "model_max_length": 40960}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write(shape_name: str, fmt: str, out: Path, seed: int = 0) -> int:
    shape = SHAPES[shape_name]
    if shape.arch != "qwen3":
        raise SystemExit(f"{shape_name}: only qwen3 shapes are written as safetensors")
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, StoredTensor] = {}
    for name, (rows, cols) in matrix_shapes(shape).items():
        tensors |= matrix_tensors(hf_name(name), storage(fmt, name), rows, cols, rng)
    norms = {"model.norm.weight": shape.hidden}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        norms |= {p + "input_layernorm.weight": shape.hidden, p + "post_attention_layernorm.weight": shape.hidden,
                  p + "self_attn.q_norm.weight": shape.head_dim, p + "self_attn.k_norm.weight": shape.head_dim}  # fmt: skip
    for name, size in norms.items():
        tensors[name] = StoredTensor(
            "F32", (size,), (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)
        )
    shards: list[dict[str, StoredTensor]] = [{}]
    for name, tensor in tensors.items():  # shards of about SHARD_BYTES, in order
        if shards[-1] and sum(t.nbytes for t in shards[-1].values()) + tensor.nbytes > SHARD_BYTES:
            shards.append({})
        shards[-1][name] = tensor
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(out / file, shard)
        weight_map |= dict.fromkeys(shard, file)
    total = sum(t.nbytes for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps(config_json(shape, fmt), indent=2) + "\n")
    write_tokenizer(out, shape.vocab)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape", choices=sorted(n for n, s in SHAPES.items() if s.arch == "qwen3"), required=True
    )
    parser.add_argument("--format", choices=["fp8-block", "nvfp4", "mix"], default="fp8-block")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    nbytes = write(args.shape, args.format, args.out)
    print(f"{args.out}: {nbytes / 1e9:.2f} GB of weights in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
