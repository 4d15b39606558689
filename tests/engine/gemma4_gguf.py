"""Write a Gemma 4 GGUF from a Hugging Face folder at test time, the way llama.cpp's converter
(convert_hf_to_gguf.py, `Gemma4Model` over `Gemma3Model`) writes one: gguf-py's own tensor-name map, norms as
stored (Gemma 4's are plain `w`: no `+ 1`), the global layers' proportional RoPE as `rope_freqs` factors
(1 for the rotated pairs, 1e30 for the rest), per-layer KV head counts and MLP widths as arrays, the sliding
layers' head size and RoPE base as `*_swa` keys, the router's input scale and each expert's output scale as
`.scale` companions, the stacked experts as `ffn_gate_up_exps` / `ffn_down_exps`. Matrices are written as BF16
(the published weights' type: exact), vectors as F32. Only gguf-py and numpy: no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

from app.engine.models.gemma4 import kv_sources

GQ = gguf.GGMLQuantizationType


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_hf(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """config.json and every tensor of model.safetensors as float32 (the file's layout read directly:
    safetensors' numpy reader has no bfloat16)."""
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    raw = (folder / "model.safetensors").read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    body = memoryview(raw)[8 + header_len :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        data = np.frombuffer(body[start:end], dtype=_DTYPES[info["dtype"]]).reshape(info["shape"])
        tensors[name] = _bf16_to_f32(data) if info["dtype"] == "BF16" else data.astype(np.float32)
    return cfg, tensors


def write_tokenizer(writer: gguf.GGUFWriter, vocab_size: int, control: dict[int, str] | None = None) -> None:
    """A minimal SentencePiece-style vocabulary (the tests run on token ids); `control`: more control
    tokens by id (a vision model's image tokens)."""
    control = {0: "<pad>", 1: "<eos>", 2: "<bos>", **(control or {})}
    tokens = [control.get(i, f"<tok{i}>") for i in range(vocab_size)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab_size)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if i in control else gguf.TokenType.NORMAL for i in range(vocab_size)]
    )
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)


# the vision and audio towers of a Gemma4ForConditionalGeneration folder: the mmproj's, not the text GGUF's
_TOWERS = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")


def write_gguf(folder: Path, out: Path, qtype: GQ = GQ.BF16, control: dict[int, str] | None = None) -> None:
    """The text model of `folder` (a Gemma4ForCausalLM, or a Gemma4ForConditionalGeneration's decoder),
    its matrices in `qtype` (BF16, or F32 for float32 weights), `control` tokens added to the vocabulary."""
    cfg, tensors = read_hf(folder)
    cfg = cfg.get("text_config", cfg)
    tensors = {
        name.replace("model.language_model.", "model.", 1): data
        for name, data in tensors.items()
        if not name.startswith(_TOWERS)
    }
    layers = cfg["num_hidden_layers"]
    sliding = [t == "sliding_attention" for t in cfg["layer_types"]]
    overrides = cfg.get("per_layer_config") or {}
    head_dim = cfg["head_dim"]
    global_dim = next((o["head_dim"] for o in overrides.values() if "head_dim" in o), head_dim)
    kv = [
        overrides.get(str(i), {}).get("num_key_value_heads", cfg["num_key_value_heads"])
        for i in range(layers)
    ]
    shared = cfg.get("num_kv_shared_layers") or 0
    sources = kv_sources(tuple(sliding), shared) or tuple(range(layers))
    ff = cfg["intermediate_size"]
    widths = [2 * ff if cfg.get("use_double_wide_mlp") and sources[i] != i else ff for i in range(layers)]
    rope = cfg["rope_parameters"]

    writer = gguf.GGUFWriter(str(out), "gemma4")
    writer.add_name("tiny-random-gemma4")
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(widths if len(set(widths)) > 1 else ff)
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(kv)
    writer.add_key_length(global_dim)
    writer.add_value_length(global_dim)
    writer.add_key_length_swa(head_dim)
    writer.add_value_length_swa(head_dim)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    writer.add_rope_dimension_count(global_dim)
    writer.add_rope_dimension_count_swa(head_dim)
    writer.add_sliding_window(cfg["sliding_window"])
    writer.add_sliding_window_pattern(sliding)
    writer.add_shared_kv_layers(shared)
    writer.add_embedding_length_per_layer_input(cfg.get("hidden_size_per_layer_input") or 0)
    if cfg.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if cfg.get("enable_moe_block"):
        writer.add_expert_count(cfg["num_experts"])
        writer.add_expert_used_count(cfg["top_k_experts"])
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if qtype == GQ.BF16 else gguf.LlamaFileType.ALL_F32)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_tokenizer(writer, cfg["vocab_size"], control)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, layers)
    out_tensors: list[tuple[str, np.ndarray]] = []
    fraction = rope["full_attention"].get("partial_rotary_factor", 1.0)
    rotated = int(global_dim * fraction / 2)
    out_tensors.append(
        ("rope_freqs.weight", np.array([1.0] * rotated + [1e30] * (global_dim // 2 - rotated), np.float32))
    )
    for hf_name, data in tensors.items():
        name = hf_name
        for suffix, companion in ((".router.scale", "ffn_gate_inp.scale"), (".router.per_expert_scale", "ffn_down_exps.scale"),
                                  (".layer_scalar", "layer_output_scale.weight")):  # fmt: skip
            if hf_name.endswith(suffix):
                layer = hf_name.split(".layers.")[1].split(".")[0]
                out_tensors.append((f"blk.{layer}.{companion}", data.reshape(-1)))
                break
        else:
            if hf_name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
                name = hf_name + ".weight"
            mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
            if mapped is None:
                raise KeyError(f"no GGUF name for {hf_name}")
            out_tensors.append((mapped, data))
    for name, data in out_tensors:
        if data.ndim >= 2 and qtype == GQ.F32:
            writer.add_tensor(name, data.astype(np.float32))
        elif data.ndim >= 2:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, data.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
