"""Write a Muse Glimmer (text) GGUF from a Hugging Face folder at test time, the way llama.cpp's converter
(convert_hf_to_gguf.py's `MuseGlimmerModel`) writes one: arch `muse-glimmer`, the four layer norms stored as
`1 + w` (the final norm as `w`), q/k rows permuted for llama.cpp's interleaved rotation, the query norm's
weight `qk_scale_factor` and the key norm's ones (synthesised: the model's QK norms have none),
`output_multiplier` as `logit_scale`, the sliding layers as a `sliding_window_pattern` list; the vision side
is left to the mmproj file. The installed gguf-py has no `muse-glimmer` tensor map, so the names are
llama.cpp's, written out below. Matrices are written as BF16 (exact), vectors as F32.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
from gemma4_gguf import read_hf, write_tokenizer
from laguna_gguf import write_tensors

_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.gate_proj": "attn_gate",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GLOBAL = {"model.language_model.embed_tokens.weight": "token_embd.weight",
           "model.language_model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}  # fmt: skip
_LAYER_NAME = re.compile(r"^model\.language_model\.layers\.(\d+)\.(.+)\.weight$")


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half row order -> llama.cpp's interleaved pairs (its converter's `_unpermute_for_rope`)."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_gguf(
    folder: Path, out: Path, qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.BF16
) -> None:
    cfg, tensors = read_hf(folder)
    text = cfg["text_config"]
    layers, head_dim = text["num_hidden_layers"], text["head_dim"]
    writer = gguf.GGUFWriter(str(out), "muse-glimmer")
    writer.add_name("tiny-random-muse-glimmer")
    writer.add_context_length(text["max_position_embeddings"])
    writer.add_embedding_length(text["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(text["intermediate_size"])
    writer.add_head_count(text["num_attention_heads"])
    writer.add_head_count_kv(text["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(text["rms_norm_eps"])
    writer.add_rope_freq_base(text["rope_parameters"]["rope_theta"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_final_logit_softcapping(text["final_logit_softcapping"])
    writer.add_logit_scale(text["output_multiplier"])
    writer.add_sliding_window(text["sliding_window"])
    writer.add_sliding_window_pattern([t == "sliding_attention" for t in text["layer_types"]])
    writer.add_vocab_size(text["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_tokenizer(writer, text["vocab_size"])
    out_tensors: dict[str, np.ndarray] = {}
    for name, data in tensors.items():
        if name in _GLOBAL:
            out_tensors[_GLOBAL[name]] = data
            continue
        m = _LAYER_NAME.match(name)
        if m is None:
            if name.startswith("model.vision_"):  # the tower, adapter and projection: the mmproj's
                continue
            raise KeyError(f"no GGUF name for {name}")
        layer, part = m.group(1), _LAYER[m.group(2)]
        if part.endswith("norm"):
            data = data + np.float32(1.0)
        elif part in ("attn_q", "attn_k"):
            data = permute(data, text["num_attention_heads" if part == "attn_q" else "num_key_value_heads"])
        out_tensors[f"blk.{layer}.{part}.weight"] = data
    for layer in range(layers):
        out_tensors[f"blk.{layer}.attn_q_norm.weight"] = np.full(
            head_dim, text["qk_scale_factor"], np.float32
        )
        out_tensors[f"blk.{layer}.attn_k_norm.weight"] = np.ones(head_dim, np.float32)
    write_tensors(writer, out_tensors, qtype)
