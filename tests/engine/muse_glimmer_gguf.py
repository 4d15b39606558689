"""Write a Muse Glimmer (text) GGUF from a Hugging Face folder at test time, the way llama.cpp's converter
(convert_hf_to_gguf.py's `MuseGlimmerModel`) writes one: arch `muse-glimmer`, the four layer norms stored as
`1 + w` (the final norm as `w`), q/k rows permuted for llama.cpp's interleaved rotation, the query norm's
weight `qk_scale_factor` and the key norm's ones (synthesised: the model's QK norms have none),
`output_multiplier` as `logit_scale`, the sliding layers as a `sliding_window_pattern` list; the vision side
is left to the mmproj file. The installed gguf-py has no `muse-glimmer` tensor map, so the names are
llama.cpp's, written out below. Matrices are written as BF16 (exact from a bf16 folder), vectors as F32;
`image_tokens` names vocabulary entries (the tiny vocabularies' image tokens) for the image prompter.

`write_mmproj` writes the vision side as the converter's `MuseGlimmerVisionModel` does: the tower's tensors
under clip.cpp's names, the patch embedding's temporal halves summed to `[hidden, 3, p, p]`, q/k rows and
biases permuted for ggml's interleaved rotation, the adapter and projection as `mm.0` / `mm.1` / `mm.2`.
"""

from __future__ import annotations

import json
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
    """HF's rotate-half row order -> llama.cpp's interleaved pairs (its converter's `_unpermute_for_rope`),
    for a matrix's rows or a bias."""
    rows = weight.shape[0]
    split = weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


class _NamedTokens:
    """A writer whose token list renames the given ids (the rest of the writer as it is)."""

    def __init__(self, writer: gguf.GGUFWriter, names: dict[str, int]) -> None:
        self._writer, self._names = writer, {i: name for name, i in names.items()}

    def add_token_list(self, tokens: list[str]) -> None:
        self._writer.add_token_list([self._names.get(i, token) for i, token in enumerate(tokens)])

    def __getattr__(self, name: str):
        return getattr(self._writer, name)


def write_gguf(
    folder: Path,
    out: Path,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.BF16,
    image_tokens: dict[str, int] | None = None,
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
    write_tokenizer(_NamedTokens(writer, image_tokens or {}), text["vocab_size"])
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


_VISION_LAYER = {
    "attn.q_proj": "attn_q", "attn.k_proj": "attn_k", "attn.v_proj": "attn_v", "attn.proj": "attn_out",
    "norm1": "ln1", "norm2": "ln2", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down",
}  # fmt: skip
_VISION_GLOBAL = {
    "model.vision_tower.patch_embedder.position_embedding_table.weight": "v.position_embd.weight",
    "model.vision_tower.ln_pre.weight": "v.pre_ln.weight", "model.vision_tower.ln_pre.bias": "v.pre_ln.bias",
    "model.vision_tower.ln_post.weight": "v.post_ln.weight", "model.vision_tower.ln_post.bias": "v.post_ln.bias",
    "model.vision_adapter.fc1.weight": "mm.0.weight", "model.vision_adapter.fc2.weight": "mm.1.weight",
    "model.vision_projection.weight": "mm.2.weight",
}  # fmt: skip
_VISION_LAYER_NAME = re.compile(r"^model\.vision_tower\.layers\.(\d+)\.(.+)\.(weight|bias)$")
PATCH_EMBEDDING = "model.vision_tower.patch_embedder.patch_embedding.weight"


def write_mmproj(
    folder: Path,
    out: Path,
    replace: dict[str, np.ndarray] | None = None,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
) -> None:
    """The folder's vision tower, adapter and projection as llama.cpp's `muse-glimmer` mmproj, matrices as
    `qtype` (the converter's default is F16), vectors F32; `replace` swaps the given file tensors for
    other values, adds them, or drops those given as None (a corrupt file)."""
    cfg, tensors = read_hf(folder)
    vision = cfg["vision_config"]
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    heads, patch = vision["num_attention_heads"], vision["patch_size"]
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ])
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == gguf.GGMLQuantizationType.F32 else gguf.LlamaFileType.MOSTLY_F16)
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(cfg["text_config"]["hidden_size"])
    writer.add_vision_image_size(vision["pos_emb_height"] * patch * vision["merge_size"])  # nominal
    writer.add_vision_patch_size(patch)
    writer.add_vision_embedding_length(vision["hidden_size"])
    writer.add_vision_feed_forward_length(vision["intermediate_size"])
    writer.add_vision_block_count(vision["num_hidden_layers"])
    writer.add_vision_head_count(heads)
    writer.add_vision_image_mean(processor["image_mean"])
    writer.add_vision_image_std(processor["image_std"])
    writer.add_clip_projector_type("muse-glimmer")
    writer.add_vision_attention_layernorm_eps(vision["layer_norm_eps"])
    writer.add_vision_spatial_merge_size(vision["merge_size"])
    out_tensors: dict[str, np.ndarray] = {}
    for name, data in tensors.items():
        if name == PATCH_EMBEDDING:
            frames = data.reshape(data.shape[0], vision["patch_temporal"], 3, patch, patch)
            out_tensors["v.patch_embd.weight"] = frames.sum(axis=1)
        elif name in _VISION_GLOBAL:
            out_tensors[_VISION_GLOBAL[name]] = data
        elif (m := _VISION_LAYER_NAME.match(name)) is not None:
            part = _VISION_LAYER[m.group(2)]
            if part in ("attn_q", "attn_k"):
                data = permute(data, heads)
            out_tensors[f"v.blk.{m.group(1)}.{part}.{m.group(3)}"] = data
    edited = {name: data for name, data in {**out_tensors, **(replace or {})}.items() if data is not None}
    write_tensors(writer, edited, qtype)
