"""Granite 4.0 hybrid (granite-4.0-h-micro / tiny / small; GraniteMoeHybridForCausalLM): Mamba-2 and
attention layers, each followed by a feed-forward: a dense gated MLP (`shared_mlp`) when the config
has no experts, else a mixture of experts (top k logits, softmax over them) plus that MLP as a
shared expert. Granite's four scalars apply (granite.py): embeddings times `embedding_multiplier`,
each sublayer's output times `residual_multiplier`, attention scores times `attention_multiplier`,
logits divided by `logits_scaling`.

Layers: config.json `layer_types` ("mamba" / "attention", or transformers 5's "linear_attention" /
"full_attention"; Bamba-style configs give `attn_layer_indices`); a GGUF (`granitehybrid`) marks
attention layers by a non-zero `attention.head_count_kv` entry. Attention takes positions only when
`position_embedding_type` is "rope" (GGUF: `rope.scaling.finetuned`, as llama.cpp's converter
writes it; the released models use none).

Checkpoint quirks: the shared MLP's and the experts' gate and up rows are one tensor in folders
(`input_linear`, gate rows first), split here as llama.cpp's converter splits them (into
`ffn_{gate,up}_shexp` with experts, `ffn_{gate,up}` without), in the file's format; folders hold
A_log (-exp here).
"""

from __future__ import annotations

from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models import mamba2_checkpoints as m2
from app.engine.models.config import (
    FFN_DENSE,
    FFN_MOE,
    MIXER_ATTENTION,
    MIXER_MAMBA2,
    ModelConfig,
    MoeSpec,
    common_from_gguf,
    common_from_hf,
    size,
)
from app.engine.models.family import Family, Tensors
from app.engine.models.granite import scalars_from_gguf, scalars_from_hf

_LAYER_TYPES = {
    "mamba": MIXER_MAMBA2, "linear_attention": MIXER_MAMBA2, "attention": MIXER_ATTENTION, "full_attention": MIXER_ATTENTION,
}  # fmt: skip
_HF_MAMBA = {
    "num_heads": ("mamba_n_heads",),
    "head_dim": ("mamba_d_head",),
    "state_size": ("mamba_d_state",),
    "n_groups": ("mamba_n_groups",),
    "conv_kernel": ("mamba_d_conv",),
    "chunk_size": ("mamba_chunk_size",),
}


def _mixers_from_hf(cfg: dict[str, Any], layers: int) -> tuple[str, ...]:
    types = cfg.get("layer_types")
    if types is None:
        attention = set(cfg.get("attn_layer_indices") or [])
        return tuple(MIXER_ATTENTION if i in attention else MIXER_MAMBA2 for i in range(layers))
    if not isinstance(types, list) or len(types) != layers or any(t not in _LAYER_TYPES for t in types):
        raise CheckpointError(
            f"config.json layer_types is {types!r}: expected {layers} of {sorted(_LAYER_TYPES)}"
        )
    return tuple(_LAYER_TYPES[t] for t in types)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    if cfg.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json hidden_act is {cfg['hidden_act']!r}: only 'silu' is supported")
    position = cfg.get("position_embedding_type")
    if position not in (None, "nope", "rope"):
        raise CheckpointError(f"config.json position_embedding_type is {position!r}: expected rope or none")
    experts = int(cfg.get("num_local_experts") or 0)
    shared = cfg.get("shared_intermediate_size")
    if shared is None:
        raise CheckpointError("config.json has no shared_intermediate_size")
    text = {**cfg, "intermediate_size": shared}  # the dense MLP / shared expert; experts' below
    if cfg.get("mamba_d_head") in (None, "auto"):
        text["mamba_d_head"] = int(cfg.get("mamba_expand", 2)) * cfg["hidden_size"] // cfg["mamba_n_heads"]
    kwargs = common_from_hf(text, "granitehybrid")
    kwargs.update(scalars_from_hf(cfg))
    moe = None
    if experts:
        moe = MoeSpec(
            num_experts=size(experts, "config.json num_local_experts", "num_experts"),
            num_used=size(cfg.get("num_experts_per_tok"), "config.json num_experts_per_tok", "num_experts"),
            intermediate_size=size(
                cfg.get("intermediate_size"), "config.json intermediate_size", "intermediate_size"
            ),
            routing="topk_softmax",
            shared_intermediate_size=kwargs["intermediate_size"],
        )
    layers = kwargs["num_layers"]
    return ModelConfig(
        **kwargs,
        layer_mixers=_mixers_from_hf(cfg, layers),
        layer_ffns=(FFN_MOE if moe else FFN_DENSE,) * layers,
        mamba2=m2.spec_from_hf(text, _HF_MAMBA, chunk_default=256),
        moe=moe,
        qkv_bias=bool(cfg.get("attention_bias", False)),
        use_rope=position == "rope",
    )


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    arch = meta["general.architecture"]
    layers = size(meta.get(f"{arch}.block_count"), f"{arch}.block_count", "num_layers")
    kv = m2.per_layer(meta, f"{arch}.attention.head_count_kv", layers)
    kwargs = common_from_gguf(
        {**meta, f"{arch}.attention.head_count_kv": max(kv) or meta.get(f"{arch}.attention.head_count")},
        vocab_size,
    )
    kwargs.update(scalars_from_gguf(meta, arch))
    moe = None
    if meta.get(f"{arch}.expert_count"):
        shared = meta.get(f"{arch}.expert_shared_feed_forward_length")
        moe = MoeSpec(
            num_experts=size(meta[f"{arch}.expert_count"], f"{arch}.expert_count", "num_experts"),
            num_used=size(meta.get(f"{arch}.expert_used_count"), f"{arch}.expert_used_count", "num_experts"),
            # llama.cpp's granite MoE experts are feed_forward_length wide
            intermediate_size=kwargs["intermediate_size"],
            routing="topk_softmax",
            shared_intermediate_size=None
            if not shared
            else size(shared, f"{arch}.expert_shared_feed_forward_length", "intermediate_size"),
        )
        if moe.shared_intermediate_size:
            kwargs["intermediate_size"] = moe.shared_intermediate_size
    use_rope = bool(meta.get(f"{arch}.rope.scaling.finetuned", False))
    return ModelConfig(
        **kwargs,
        layer_mixers=tuple(MIXER_ATTENTION if k else MIXER_MAMBA2 for k in kv),
        layer_ffns=(FFN_MOE if moe else FFN_DENSE,) * layers,
        mamba2=m2.spec_from_gguf(meta),
        moe=moe,
        use_rope=use_rope,
        rope_interleaved=True,  # the converter permutes q/k rows as for Llama
    )


def adapt_hf_tensors(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    """Split the fused gate/up tensors (gate rows first); with experts, the shared MLP is the shared expert."""
    adapted = m2.a_from_a_log(tensors)
    shared = "_shexp" if cfg.moe is not None else ""
    for name, tensor in list(adapted.items()):
        prefix, _, rest = name.partition(".ffn_")
        if rest in ("gate_up.weight", "gate_up_exps.weight"):
            del adapted[name]
            suffix = "_exps" if rest.startswith("gate_up_exps") else shared
            half = tensor.shape[-2] // 2
            for part, lo in (("gate", 0), ("up", half)):
                new = f"{prefix}.ffn_{part}{suffix}.weight"
                adapted[new] = m2.rows(new, tensor, lo, lo + half)
        elif rest == "down.weight" and shared:
            adapted[f"{prefix}.ffn_down_shexp.weight"] = adapted.pop(name)
    return adapted


FAMILY = Family(
    gguf_arch="granitehybrid",
    hf_architectures=("GraniteMoeHybridForCausalLM",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
    adapt_hf_tensors=adapt_hf_tensors,
)
