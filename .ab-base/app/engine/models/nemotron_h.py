"""Nemotron-H (Nemotron-H 8B/47B, Nemotron Nano 2, Nemotron 3 Nano with experts): Mamba-2,
attention and feed-forward layers, each layer ONE of them behind a single RMS norm.

The layer pattern is config.json's `hybrid_override_pattern` ("M" Mamba-2, "*" attention, "-" MLP,
"E" mixture of experts) or transformers 5's `layers_block_type` list; a GGUF (`nemotron_h`, or
`nemotron_h_moe` with experts) says it per layer as llama.cpp reads it: `attention.head_count_kv`
above 0 is attention, `feed_forward_length` above 0 a feed-forward (experts in nemotron_h_moe),
neither Mamba-2. Attention has no positions (NoPE) and the default 1/sqrt(head_dim) scale. The MLP,
the experts and the shared expert are plain `down(relu(up x)^2)`. The router takes sigmoid scores,
picks the top k of scores + `e_score_correction_bias` within the best `topk_group` of `n_group`
expert groups, and weighs them by their scores (renormalised) times `routed_scaling_factor`.

Checkpoint quirks: the one norm is `attn_norm` in both layouts and moves to `ffn_norm` on
feed-forward layers here; folders hold A_log (-exp here, as GGUF stores it). Hub files keep
everything under `backbone.`, their experts one projection per expert. The multi-token-prediction
head (folders: `mtp.*`; GGUFs: the last `nextn_predict_layers` blocks) is no part of the model: a GGUF's
runs as `--speculative mtp`'s drafter (models/mtp.py). Nemotron 3 Super's
experts work in a smaller space (`moe_latent_size`: `fc1_latent_proj` down before them, `fc2_latent_proj`
up after; GGUF `ffn_latent_down` / `ffn_latent_up`).
"""

from __future__ import annotations

from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models import mamba2_checkpoints as m2
from app.engine.models.config import (
    FFN_DENSE,
    FFN_MOE,
    FFN_NONE,
    MIXER_ATTENTION,
    MIXER_MAMBA2,
    MIXER_NONE,
    ModelConfig,
    MoeSpec,
    common_from_gguf,
    common_from_hf,
    positive_number,
    size,
)
from app.engine.models.family import Family, Tensors

# pattern letter / layers_block_type name -> (mixer, feed-forward)
_KINDS = {
    "M": (MIXER_MAMBA2, FFN_NONE),
    "*": (MIXER_ATTENTION, FFN_NONE),
    "-": (MIXER_NONE, FFN_DENSE),
    "E": (MIXER_NONE, FFN_MOE),
}
_NAMES = {
    "mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-", "moe": "E",
}  # fmt: skip
# Mamba2Spec field -> config.json keys (NemotronHConfig's, then the legacy names it also accepts)
_HF_MAMBA = {
    "num_heads": ("mamba_num_heads",),
    "head_dim": ("mamba_head_dim",),
    "state_size": ("ssm_state_size",),
    "n_groups": ("n_groups", "mamba_n_groups"),
    "conv_kernel": ("conv_kernel", "mamba_d_conv"),
    "chunk_size": ("chunk_size", "mamba_chunk_size"),
}


def pattern_from_hf(cfg: dict[str, Any]) -> str:
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is None:
        types = cfg.get("layers_block_type") or cfg.get("layer_types")
        if not isinstance(types, list):
            raise CheckpointError("config.json has no hybrid_override_pattern or layers_block_type")
        unknown = sorted({t for t in types if t not in _NAMES}, key=str)
        if unknown:
            raise CheckpointError(f"config.json layers_block_type has {unknown}; known: {sorted(_NAMES)}")
        pattern = "".join(_NAMES[t] for t in types)
    if not isinstance(pattern, str) or not pattern or set(pattern) - set(_KINDS):
        raise CheckpointError(f"config.json hybrid_override_pattern is {pattern!r}: letters M, *, - and E")
    return pattern


def _layers(pattern: str) -> dict[str, Any]:
    return {
        "layer_mixers": tuple(_KINDS[c][0] for c in pattern),
        "layer_ffns": tuple(_KINDS[c][1] for c in pattern),
    }


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    pattern = pattern_from_hf(cfg)
    layers = cfg.get("num_hidden_layers")
    if layers is not None and layers != len(pattern):
        raise CheckpointError(
            f"config.json num_hidden_layers is {layers}, but the layer pattern has {len(pattern)}"
        )
    for key, wanted in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if cfg.get(key, wanted) != wanted:
            raise CheckpointError(f"config.json {key} is {cfg[key]!r}: only {wanted!r} is supported")
    text = {
        **cfg,
        "num_hidden_layers": len(pattern),
        "rms_norm_eps": cfg.get("layer_norm_epsilon", cfg.get("rms_norm_eps", 1e-5)),
        # the hub's older configs name it attention_head_dim (as llama.cpp's converter also reads)
        "head_dim": cfg.get("head_dim") or cfg.get("attention_head_dim"),
    }
    moe = _moe_from_hf(cfg) if "E" in pattern else None
    if "-" not in pattern and moe is not None:  # no dense MLP: intermediate_size is unused
        text["intermediate_size"] = moe.intermediate_size
    kwargs = common_from_hf(text, "nemotron_h_moe" if moe is not None else "nemotron_h")
    spec = m2.spec_from_hf(cfg, _HF_MAMBA, chunk_default=128)
    return ModelConfig(**kwargs, **_layers(pattern), mamba2=spec, moe=moe, activation="relu2", use_rope=False)


def _moe_from_hf(cfg: dict[str, Any]) -> MoeSpec:

    def need(key: str, field: str = "num_experts") -> int:
        if key not in cfg:
            raise CheckpointError(f"config.json has no {key}")
        return size(cfg[key], f"config.json {key}", field)

    return _moe(
        experts=need("n_routed_experts"),
        used=need("num_experts_per_tok"),
        ff=need("moe_intermediate_size", "intermediate_size"),
        shared=need("moe_shared_expert_intermediate_size", "intermediate_size")
        if cfg.get("n_shared_experts", 1)
        else None,
        normalize=bool(cfg.get("norm_topk_prob", True)),
        groups=size(cfg.get("n_group", 1), "config.json n_group", "num_experts"),
        used_groups=size(cfg.get("topk_group", 1), "config.json topk_group", "num_experts"),
        scale=positive_number(cfg.get("routed_scaling_factor", 1.0), "config.json routed_scaling_factor"),
        latent=None
        if cfg.get("moe_latent_size") is None
        else size(cfg["moe_latent_size"], "config.json moe_latent_size", "hidden_size"),
    )


def _moe(
    experts: int,
    used: int,
    ff: int,
    shared: int | None,
    normalize: bool,
    groups: int,
    used_groups: int,
    scale: float,
    latent: int | None,
) -> MoeSpec:
    if experts % groups or used_groups > groups or used > used_groups * (experts // groups):
        raise CheckpointError(
            f"{experts} experts in {groups} groups, {used_groups} groups used, {used} experts per token: "
            "not a routing a real model has"
        )
    return MoeSpec(
        num_experts=experts,
        num_used=used,
        intermediate_size=ff,
        routing="sigmoid_grouped",
        normalize=normalize,
        num_groups=groups,
        topk_groups=used_groups,
        routed_scale=scale,
        activation="relu2",
        shared_intermediate_size=shared,
        latent_size=latent,
    )


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    arch = meta["general.architecture"]
    blocks = size(meta.get(f"{arch}.block_count"), f"{arch}.block_count", "num_layers")
    # the converter appends the multi-token-prediction head as the last block(s): not run here
    mtp = int(meta.get(f"{arch}.nextn_predict_layers") or 0)
    if not 0 <= mtp < blocks:
        raise CheckpointError(f"{arch}.nextn_predict_layers is {mtp} of {blocks} blocks")
    layers = blocks - mtp
    kv = m2.per_layer(meta, f"{arch}.attention.head_count_kv", blocks)[:layers]
    ff = m2.per_layer(meta, f"{arch}.feed_forward_length", blocks)[:layers]
    moe_arch = arch == "nemotron_h_moe"
    pattern = "".join(
        ("*" if k else "M") if not f else ("E" if moe_arch else "-") for k, f in zip(kv, ff, strict=True)
    )
    if any(k and f for k, f in zip(kv, ff, strict=True)):
        raise CheckpointError(
            f"{arch}: a layer with both attention and a feed-forward (head_count_kv, feed_forward_length)"
        )
    heads = meta.get(f"{arch}.attention.head_count")
    scalar = {
        **meta,
        f"{arch}.block_count": layers,
        f"{arch}.attention.head_count_kv": max(kv) or heads,
        f"{arch}.feed_forward_length": max(ff) or 1,
    }
    kwargs = common_from_gguf(scalar, vocab_size)
    moe = _moe_from_gguf(meta, arch) if moe_arch else None
    return ModelConfig(
        **kwargs,
        **_layers(pattern),
        mamba2=m2.spec_from_gguf(meta),
        moe=moe,
        activation="relu2",
        use_rope=False,
        trailing_blocks=mtp,
    )


def _moe_from_gguf(meta: dict[str, Any], arch: str) -> MoeSpec:
    def need(key: str, field: str = "num_experts") -> int:
        full = f"{arch}.{key}"
        if full not in meta:
            raise CheckpointError(f"metadata has no {full}")
        return size(meta[full], full, field)

    shared = meta.get(f"{arch}.expert_shared_feed_forward_length")
    latent = meta.get(f"{arch}.moe_latent_size")
    return _moe(
        experts=need("expert_count"),
        used=need("expert_used_count"),
        ff=need("expert_feed_forward_length", "intermediate_size"),
        shared=None
        if not shared
        else size(shared, f"{arch}.expert_shared_feed_forward_length", "intermediate_size"),
        normalize=bool(meta.get(f"{arch}.expert_weights_norm", True)),
        groups=size(meta.get(f"{arch}.expert_group_count", 1), f"{arch}.expert_group_count", "num_experts"),
        used_groups=size(
            meta.get(f"{arch}.expert_group_used_count", 1), f"{arch}.expert_group_used_count", "num_experts"
        ),
        scale=positive_number(meta.get(f"{arch}.expert_weights_scale", 1.0), f"{arch}.expert_weights_scale"),
        latent=None if not latent else size(latent, f"{arch}.moe_latent_size", "hidden_size"),
    )


def _ffn_norms(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    """The one norm of a feed-forward layer, where the decoder reads a feed-forward's norm."""
    adapted = dict(tensors)
    for layer in range(cfg.num_layers):
        name = f"blk.{layer}.attn_norm.weight"
        if cfg.mixer(layer) == MIXER_NONE and name in adapted:
            adapted[f"blk.{layer}.ffn_norm.weight"] = adapted.pop(name)
    return adapted


def adapt_hf_tensors(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    return _ffn_norms(m2.a_from_a_log(tensors), cfg)


FAMILY = Family(
    gguf_arch="nemotron_h",
    hf_architectures=("NemotronHForCausalLM",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
    adapt_hf_tensors=adapt_hf_tensors,
    adapt_gguf_tensors=_ffn_norms,
)
