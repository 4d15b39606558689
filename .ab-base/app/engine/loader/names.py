"""Checkpoint names: Hugging Face tensor names translated to GGUF's, per architecture, as data.

The model modules speak GGUF names only (`blk.3.attn_q.weight`), whatever file the weights
came from. The tables follow llama.cpp's tensor mapping. They rename and nothing more: model
quirks (Gemma's `1 + weight` norms, the llama q/k row permutation of GGUF conversions) are
applied by the model modules beside the weights they affect.

This module is the bottom of the loader package, so it also owns `CheckpointError`.
"""

from __future__ import annotations

import re
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint cannot be read; the message names the file (or tensor) and what is wrong."""


# config.json "architectures" entry (or "model_type") -> GGUF architecture name.
HF_ARCHITECTURES: dict[str, str] = {
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # its text part; the vision tower is skipped
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",  # its text part; the vision and audio towers are skipped
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "Qwen3ASRForConditionalGeneration": "qwen3",  # its text part; models/audio/ loads the audio side
    "GraniteForCausalLM": "granite",
    "GraniteSpeechForConditionalGeneration": "granite",  # its text part; models/audio/ loads the audio side
    "GptOssForCausalLM": "gpt-oss",
    "Qwen2_5_VLForConditionalGeneration": "qwen2vl",  # llama.cpp's name for the Qwen2-VL text side
    "Qwen3_5ForCausalLM": "qwen35",
    "Qwen3_5ForConditionalGeneration": "qwen35",  # its text part; the vision tower is skipped
    "Qwen3_5MoeForCausalLM": "qwen35moe",
    "Qwen3_5MoeForConditionalGeneration": "qwen35moe",
    "Qwen3NextForCausalLM": "qwen3next",
    "NemotronHForCausalLM": "nemotron_h",  # with or without experts (GGUF: nemotron_h / nemotron_h_moe)
    "GraniteMoeHybridForCausalLM": "granitehybrid",
    "LagunaForCausalLM": "laguna",
    "MuseGlimmerForConditionalGeneration": "muse-glimmer",  # its text part; the vision side is skipped
    "PaddleOCRVLForConditionalGeneration": "paddleocr",  # its ERNIE text part; models/vision/ loads the tower
}
_HF_MODEL_TYPES: dict[str, str] = {
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "gemma4": "gemma4",
    "gemma4_text": "gemma4",
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "qwen3_asr": "qwen3",
    "granite": "granite",
    "granite_speech": "granite",
    "gpt_oss": "gpt-oss",
    "qwen2_5_vl": "qwen2vl",
    "qwen3_5": "qwen35",
    "qwen3_5_text": "qwen35",
    "qwen3_5_moe": "qwen35moe",
    "qwen3_5_moe_text": "qwen35moe",
    "qwen3_next": "qwen3next",
    "nemotron_h": "nemotron_h",
    "granitemoehybrid": "granitehybrid",
    "laguna": "laguna",
    "muse_glimmer": "muse-glimmer",
    "paddleocr_vl": "paddleocr",
}

# Where the text model sits inside the checkpoint: plain CausalLM, the language model of a
# multimodal checkpoint (transformers >= 4.52 writes `model.language_model.`, older `language_model.model.`),
# Nemotron-H's `backbone.`, or the bare model without the causal-LM wrapper (Qwen3-Embedding is saved as a
# Qwen3Model: no prefix and no lm_head, while its config.json names Qwen3ForCausalLM).
_BODY_PREFIXES = ("model.language_model.", "language_model.model.", "model.", "backbone.", "")
_HEAD_PREFIXES = ("language_model.lm_head.", "lm_head.")

_GLOBAL_MODULES = {
    "embed_tokens": "token_embd",
    "norm": "output_norm",
    "embeddings": "token_embd",
    "norm_f": "output_norm",
}
# Model-level tensors some architectures add (Gemma 4's per-layer input embeddings).
_ARCH_GLOBAL_MODULES: dict[str, dict[str, str]] = {
    "gemma4": {
        "embed_tokens_per_layer": "per_layer_token_embd",
        "per_layer_model_projection": "per_layer_model_proj",
        "per_layer_projection_norm": "per_layer_proj_norm",
    },
}

_ATTENTION_AND_MLP = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_QK_NORMS = {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
# Llama and Qwen have one norm before the MLP, which HF calls post_attention_layernorm.
_PRE_MLP_NORM = {"post_attention_layernorm": "ffn_norm"}
# Gemma 3 has sandwich norms: here post_attention_layernorm really follows attention.
_GEMMA_SANDWICH_NORMS = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}

# Gemma 4 adds experts beside the MLP (with norms of their own), its router's projection, and the
# per-layer input (PLE) gate, projection and norm.
_GEMMA4 = {
    **_ATTENTION_AND_MLP,
    **_QK_NORMS,
    **_GEMMA_SANDWICH_NORMS,
    "post_feedforward_layernorm_1": "post_ffw_norm_1",
    "pre_feedforward_layernorm_2": "pre_ffw_norm_2",
    "post_feedforward_layernorm_2": "post_ffw_norm_2",
    "router.proj": "ffn_gate_inp",
    "per_layer_input_gate": "inp_gate",
    "per_layer_projection": "proj",
    "post_per_layer_input_norm": "post_norm",
}

# Mixture-of-experts routers (HF `mlp.gate` / `mlp.router`, a linear to one logit per expert).
_ROUTER = {"mlp.gate": "ffn_gate_inp", "mlp.router": "ffn_gate_inp"}
# GPT-OSS's attention: every projection has a bias (on the same names), plus a sink logit per head.
_GPT_OSS = {
    **{k: v for k, v in _ATTENTION_AND_MLP.items() if not k.startswith("mlp.")},
    **_PRE_MLP_NORM,
    **_ROUTER,
}

# Gated DeltaNet layers (Qwen3.5's separate projections; Qwen3-Next's fused `in_proj_qkvz` /
# `in_proj_ba`, which models/qwen35.py splits into the former as llama.cpp's converter does).
_GATED_DELTANET = {
    "linear_attn.in_proj_qkv": "attn_qkv",
    "linear_attn.in_proj_z": "attn_gate",
    "linear_attn.in_proj_b": "ssm_beta",
    "linear_attn.in_proj_a": "ssm_alpha",
    "linear_attn.in_proj_qkvz": "ssm_in",
    "linear_attn.in_proj_ba": "ssm_ba",
    "linear_attn.conv1d": "ssm_conv1d",
    "linear_attn.norm": "ssm_norm",
    "linear_attn.out_proj": "ssm_out",
}
# A shared expert beside the routed ones, with its sigmoid gate (Qwen2-MoE style names).
_SHARED_EXPERT = {
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
_QWEN35 = {**_ATTENTION_AND_MLP, **_PRE_MLP_NORM, **_QK_NORMS, **_GATED_DELTANET}


def _mamba2(module: str) -> dict[str, str]:
    """A Mamba-2 mixer's projections, conv and gated norm (Nemotron-H's under `mixer.`, Granite 4's
    under `mamba.`)."""
    parts = {"in_proj": "ssm_in", "conv1d": "ssm_conv1d", "norm": "ssm_norm", "out_proj": "ssm_out"}
    return {f"{module}.{hf}": gguf for hf, gguf in parts.items()}


def _mamba2_parameters(module: str) -> dict[str, str]:
    """Its per-head parameters (models/nemotron_h.py stores -exp(A_log) as `ssm_a`, as GGUF does)."""
    return {f"{module}.A_log": "ssm_a", f"{module}.D": "ssm_d", f"{module}.dt_bias": "ssm_dt.bias"}


# Nemotron-H: each layer is ONE mixer behind one norm (mamba, attention, MLP or MoE, all under
# `mixer.`); models/nemotron_h.py moves the norm of MLP / MoE layers to `ffn_norm`.
_NEMOTRON_H = {
    "norm": "attn_norm",
    **{f"mixer.{p}_proj": f"attn_{'output' if p == 'o' else p}" for p in ("q", "k", "v", "o")},
    "mixer.up_proj": "ffn_up",
    "mixer.down_proj": "ffn_down",
    "mixer.gate": "ffn_gate_inp",
    "mixer.shared_experts.up_proj": "ffn_up_shexp",
    "mixer.shared_experts.down_proj": "ffn_down_shexp",
    "mixer.fc1_latent_proj": "ffn_latent_down",  # Nemotron 3 Super's experts' smaller space
    "mixer.fc2_latent_proj": "ffn_latent_up",
    **_mamba2("mixer"),
}
# Granite 4 hybrid: mamba or attention, then a shared MLP (+ experts); the shared MLP's and the
# experts' gate and up rows are one tensor, split by models/granite_hybrid.py as llama.cpp's converter
# does (the shared MLP is the dense MLP of a model without experts, else a shared expert).
_GRANITE_HYBRID = {
    **{k: v for k, v in _ATTENTION_AND_MLP.items() if not k.startswith("mlp.")},
    **_PRE_MLP_NORM,
    **_mamba2("mamba"),
    "shared_mlp.input_linear": "ffn_gate_up",
    "shared_mlp.output_linear": "ffn_down",
    "block_sparse_moe.router.layer": "ffn_gate_inp",
    "block_sparse_moe.input_linear": "ffn_gate_up_exps",
    "block_sparse_moe.output_linear": "ffn_down_exps",
}

# Per-layer module tables (HF module path under `layers.N.` -> GGUF name under `blk.N.`).
LAYER_MODULES: dict[str, dict[str, str]] = {
    "llama": {**_ATTENTION_AND_MLP, **_PRE_MLP_NORM},
    "qwen2": {**_ATTENTION_AND_MLP, **_PRE_MLP_NORM},  # q/k/v biases ride on the same names
    "qwen2vl": {**_ATTENTION_AND_MLP, **_PRE_MLP_NORM},
    "paddleocr": {**_ATTENTION_AND_MLP, **_PRE_MLP_NORM},
    "qwen3": {**_ATTENTION_AND_MLP, **_PRE_MLP_NORM, **_QK_NORMS},
    "gemma3": {**_ATTENTION_AND_MLP, **_QK_NORMS, **_GEMMA_SANDWICH_NORMS},
    "gemma4": _GEMMA4,
    "granite": {**_ATTENTION_AND_MLP, **_PRE_MLP_NORM},
    "qwen3moe": {**_ATTENTION_AND_MLP, **_PRE_MLP_NORM, **_QK_NORMS, **_ROUTER},
    "gpt-oss": _GPT_OSS,
    "qwen35": _QWEN35,
    "qwen35moe": {**_QWEN35, **_ROUTER, **_SHARED_EXPERT},
    "qwen3next": {**_QWEN35, **_ROUTER, **_SHARED_EXPERT},
    "nemotron_h": _NEMOTRON_H,
    "granitehybrid": _GRANITE_HYBRID,
    # Laguna: its attention output gate's own projection, sparse layers' router and shared expert
    "laguna": {
        **_ATTENTION_AND_MLP,
        **_PRE_MLP_NORM,
        **_QK_NORMS,
        **_ROUTER,
        **_SHARED_EXPERT,
        "self_attn.g_proj": "attn_gate",
    },
    # Muse Glimmer: Gemma's sandwich norms, an output gate from its own projection (no QK norm weights)
    "muse-glimmer": {**_ATTENTION_AND_MLP, **_GEMMA_SANDWICH_NORMS, "self_attn.gate_proj": "attn_gate"},
}
# Parameters saved under their own name, not as `<module>.weight` (HF layer path -> GGUF name).
# GPT-OSS keeps its experts stacked, input-major, gate and up interleaved: models/gpt_oss.py
# turns `ffn_gate_up_exps` into GGUF's separate ffn_gate_exps / ffn_up_exps.
BARE_PARAMETERS: dict[str, dict[str, str]] = {
    # Gemma 4's experts are stacked with gate and up side by side (`[E, 2 ff, hidden]`); its router's
    # input scale and per-expert output scale are llama.cpp's `.scale` companions of the tensors they scale.
    "gemma4": {
        "layer_scalar": "layer_output_scale.weight",
        "experts.gate_up_proj": "ffn_gate_up_exps.weight",
        "experts.down_proj": "ffn_down_exps.weight",
        "router.scale": "ffn_gate_inp.scale",
        "router.per_expert_scale": "ffn_down_exps.scale",
    },
    "gpt-oss": {
        "self_attn.sinks": "attn_sinks.weight",
        "mlp.experts.gate_up_proj": "ffn_gate_up_exps.weight",
        "mlp.experts.gate_up_proj_bias": "ffn_gate_up_exps.bias",
        "mlp.experts.down_proj": "ffn_down_exps.weight",
        "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
    },
    # Gated DeltaNet's decay parameters (A_log: models/qwen35.py stores -exp(A_log) as GGUF does);
    # experts stacked as transformers 5 holds them (`gate_up_proj [E, 2 ff, hidden]`: gate rows, then up).
    **{
        arch: {
            "linear_attn.A_log": "ssm_a",
            "linear_attn.dt_bias": "ssm_dt.bias",
            "mlp.experts.gate_up_proj": "ffn_gate_up_exps.weight",
            "mlp.experts.down_proj": "ffn_down_exps.weight",
        }
        for arch in ("qwen35", "qwen35moe", "qwen3next")
    },
    # experts stacked as transformers 5 holds them in memory ([E, out, in]; hub files list them per expert)
    "nemotron_h": {
        **_mamba2_parameters("mixer"),
        "mixer.gate.e_score_correction_bias": "exp_probs_b.bias",
        "mixer.experts.up_proj": "ffn_up_exps.weight",
        "mixer.experts.down_proj": "ffn_down_exps.weight",
    },
    "granitehybrid": _mamba2_parameters("mamba"),
    "laguna": {"mlp.experts.e_score_correction_bias": "exp_probs_b.bias"},
}

# Tensors that are in some checkpoints but carry nothing the engine uses.
_SKIPPED = re.compile(
    r"(^|\.)rotary_emb\.inv_freq$"  # old llama checkpoints saved the RoPE table
    r"|^(model\.)?(vision_tower|multi_modal_projector)\."  # Gemma 3's image side
    r"|^(model\.)?(audio_tower|embed_vision|embed_audio)\."  # Gemma 4's image and audio sides
    r"|^(model\.)?visual\."  # Qwen2.5-VL's, Qwen3.5's, PaddleOCR-VL's tower
    r"|^(model\.)?(encoder|projector)\."  # Granite Speech's conformer and Q-Former (models/audio/ loads them)
    r"|^mlp_AR\."  # PaddleOCR-VL's projector (published layout; transformers' own: model.projector, above)
    r"|^model\.(vision_adapter|vision_projection)\."  # Muse Glimmer's projector (its tower: vision_tower)
    r"|^mtp\."  # Qwen3.5 / Qwen3-Next MTP heads: not the model itself (models/mtp.py reads them for --speculative mtp)
)
_LAYER_NAME = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")
_BARE_LAYER_NAME = re.compile(r"^layers\.(\d+)\.(.+)$")
# One expert's projection as Qwen3-MoE (and Mixtral-style) folders list them: kept per expert.
_EXPERT_MODULE = re.compile(r"^(?:mlp|mixer)\.experts\.(\d+)\.(gate|up|down)_proj$")
_GLOBAL_NAME = re.compile(r"^(\w+)\.(weight|bias)$")


def architecture_of(hf_config: dict[str, Any]) -> str:
    """GGUF architecture name of a config.json; CheckpointError if the engine cannot translate it."""
    for hf_class in hf_config.get("architectures") or []:
        if hf_class in HF_ARCHITECTURES:
            return HF_ARCHITECTURES[hf_class]
    model_type = hf_config.get("model_type")
    if model_type in _HF_MODEL_TYPES:
        return _HF_MODEL_TYPES[model_type]
    raise CheckpointError(
        f"unsupported model: architectures {hf_config.get('architectures')}, model_type {model_type!r}. "
        f"Supported: {', '.join(HF_ARCHITECTURES)}"
    )


def gguf_name(hf_name: str, architecture: str) -> str | None:
    """GGUF name of one HF tensor, or None for a tensor the engine deliberately skips."""
    if architecture not in LAYER_MODULES:
        raise CheckpointError(f"no tensor name table for architecture {architecture!r}")
    if _SKIPPED.search(hf_name):
        return None
    for prefix in _HEAD_PREFIXES:
        if hf_name.startswith(prefix) and hf_name[len(prefix) :] in ("weight", "bias"):
            return "output." + hf_name[len(prefix) :]
    for prefix in _BODY_PREFIXES:
        if hf_name.startswith(prefix):
            translated = _body_name(hf_name[len(prefix) :], architecture)
            if translated is not None:
                return translated
    raise CheckpointError(f"tensor {hf_name!r} has no GGUF name for architecture {architecture!r}")


def _body_name(name: str, architecture: str) -> str | None:
    if match := _LAYER_NAME.match(name):
        layer, module, kind = match.groups()
        if expert := _EXPERT_MODULE.match(module):
            return f"blk.{layer}.ffn_{expert.group(2)}_exps.{expert.group(1)}.{kind}"
        gguf_module = LAYER_MODULES[architecture].get(module)
        if gguf_module is not None:
            return f"blk.{layer}.{gguf_module}.{kind}"
    if match := _BARE_LAYER_NAME.match(name):
        layer, parameter = match.groups()
        gguf_parameter = BARE_PARAMETERS.get(architecture, {}).get(parameter)
        return None if gguf_parameter is None else f"blk.{layer}.{gguf_parameter}"
    if match := _GLOBAL_NAME.match(name):
        module, kind = match.groups()
        gguf_module = _GLOBAL_MODULES.get(module) or _ARCH_GLOBAL_MODULES.get(architecture, {}).get(module)
        return None if gguf_module is None else f"{gguf_module}.{kind}"
    return None
