"""Write a Laguna GGUF from a Hugging Face folder at test time, the way llama.cpp's converter
(convert_hf_to_gguf.py's `LagunaModel`) writes one: arch `laguna`, the per-layer head counts as an array
`attention.head_count`, `leading_dense_block_count` for the dense layers, the shared expert's width as
`expert_shared_feed_forward_length`, sigmoid gating, sum-normalised weights times `expert_weights_scale`,
the full layers' rotated dims as `rope.dimension_count` and the sliding ones' as `*_swa` keys, and no
`sliding_window_pattern` (llama.cpp's default: full at every 4th layer from the first); the per-expert
projections stacked `[E, out, in]`, the gate as `attn_gate`, the router's bias as `exp_probs_b.bias`.
The installed gguf-py has no `laguna` tensor map, so the names are llama.cpp's, written out below.
Matrices are written as BF16 (the published weights' type: exact), vectors as F32.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
from gemma4_gguf import read_hf, write_tokenizer

GQ = gguf.GGMLQuantizationType
# HF module under model.layers.N. -> llama.cpp's name under blk.N.
_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.g_proj": "attn_gate",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}  # fmt: skip
_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


def gguf_tensors(tensors: dict[str, np.ndarray], layers: int, experts: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    stacked: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for name, data in tensors.items():
        if name in _GLOBAL:
            out[_GLOBAL[name]] = data
        elif m := _EXPERT.match(name):
            stacked.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = data
        elif name.endswith(".mlp.experts.e_score_correction_bias"):
            out[f"blk.{name.split('.')[2]}.exp_probs_b.bias"] = data
        elif (m := _LAYER_NAME.match(name)) and m.group(2) in _LAYER:
            out[f"blk.{m.group(1)}.{_LAYER[m.group(2)]}.weight"] = data
        else:
            raise KeyError(f"no GGUF name for {name}")
    for (layer, part), per_expert in stacked.items():
        out[f"blk.{layer}.ffn_{part}_exps.weight"] = np.stack([per_expert[e] for e in range(experts)])
    return out


def write_gguf(folder: Path, out: Path, qtype: GQ = GQ.BF16) -> None:
    cfg, tensors = read_hf(folder)
    layers, head_dim = cfg["num_hidden_layers"], cfg["head_dim"]
    rope = cfg["rope_parameters"]
    dense = 0
    for kind in cfg["mlp_layer_types"]:
        if kind != "dense":
            break
        dense += 1

    writer = gguf.GGUFWriter(str(out), "laguna")
    writer.add_name("tiny-random-laguna")
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg.get("num_attention_heads_per_layer") or [cfg["num_attention_heads"]] * layers)
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    writer.add_rope_dimension_count(int(head_dim * rope["full_attention"]["partial_rotary_factor"]))
    if rope["full_attention"]["rope_type"] == "yarn":  # the full layers' (llama.cpp: the SWA ones unscaled)
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["full_attention"]["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["full_attention"]["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(rope["full_attention"]["beta_fast"])
        writer.add_rope_scaling_yarn_beta_slow(rope["full_attention"]["beta_slow"])
    if "sliding_attention" in cfg["layer_types"]:
        writer.add_sliding_window(cfg["sliding_window"])
        writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
        writer.add_rope_dimension_count_swa(
            int(head_dim * rope["sliding_attention"]["partial_rotary_factor"])
        )
    writer.add_expert_count(cfg["num_experts"])
    writer.add_expert_used_count(cfg["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    writer.add_expert_weights_norm(True)
    writer.add_expert_weights_scale(float(cfg["moe_routed_scaling_factor"]))
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    writer.add_leading_dense_block_count(dense)
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_tokenizer(writer, cfg["vocab_size"])
    write_tensors(writer, gguf_tensors(tensors, layers, cfg["num_experts"]), qtype)


def write_tensors(writer: gguf.GGUFWriter, tensors: dict[str, np.ndarray], qtype: GQ = GQ.BF16) -> None:
    """Matrices as `qtype` (BF16 by default: the published weights' type, exact from the bf16 folder; the
    routers stay F32, as llama.cpp's quantizer keeps them), vectors as F32; then the file is written."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    for name, data in tensors.items():
        if data.ndim >= 2 and "ffn_gate_inp" not in name:
            kind = qtype if data.shape[-1] % block == 0 else GQ.BF16  # rows of whole blocks, else as stored
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        elif data.ndim >= 2:
            writer.add_tensor(name, data.astype(np.float32))
        else:
            writer.add_tensor(name, data.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
