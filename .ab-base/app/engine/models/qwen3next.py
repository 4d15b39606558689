"""Qwen3-Next (80B-A3B): Qwen3.5's hybrid of Gated DeltaNet and gated attention layers (qwen35.py),
with a mixture of experts in every layer beside a shared expert whose output is scaled by
`sigmoid(x @ shared_expert_gate)`. The router takes a softmax over all experts, keeps the top k and
renormalises them (`norm_topk_prob`). Its files fuse the Gated DeltaNet projections per q/k head
(`in_proj_qkvz`, `in_proj_ba`) and keep the value heads grouped, in GGUF too.
"""

from __future__ import annotations

from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.config import ModelConfig, MoeSpec, size
from app.engine.models.family import Family
from app.engine.models.qwen35 import adapt_gguf_tensors, adapt_hf_tensors, hybrid_from_gguf, hybrid_from_hf


def moe_from_hf(cfg: dict[str, Any], normalize: bool) -> MoeSpec:
    """The routed and shared experts of a Qwen3-Next / Qwen3.5-MoE config.json."""
    cfg = cfg.get("text_config", cfg)
    if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step", 1)) != 1:
        raise CheckpointError(
            "config.json mlp_only_layers / decoder_sparse_step mix dense and expert layers: not supported"
        )
    names = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
    for name in names:
        if name not in cfg:
            raise CheckpointError(f"config.json has no {name}")
    experts, used, ff, shared = (cfg[n] for n in names)
    return MoeSpec(
        num_experts=size(experts, "config.json num_experts", "num_experts"),
        num_used=size(used, "config.json num_experts_per_tok", "num_experts"),
        intermediate_size=size(ff, "config.json moe_intermediate_size", "intermediate_size"),
        normalize=normalize,
        shared_intermediate_size=size(
            shared, "config.json shared_expert_intermediate_size", "intermediate_size"
        ),
        shared_gate=True,
    )


def moe_from_gguf(meta: dict[str, Any]) -> MoeSpec:
    arch = meta["general.architecture"]
    keys = (
        "expert_count",
        "expert_used_count",
        "expert_feed_forward_length",
        "expert_shared_feed_forward_length",
    )
    for key in keys:
        if f"{arch}.{key}" not in meta:
            raise CheckpointError(f"metadata has no {arch}.{key}")
    experts, used, ff, shared = (meta[f"{arch}.{k}"] for k in keys)
    return MoeSpec(
        num_experts=size(experts, f"{arch}.expert_count", "num_experts"),
        num_used=size(used, f"{arch}.expert_used_count", "num_experts"),
        intermediate_size=size(ff, f"{arch}.expert_feed_forward_length", "intermediate_size"),
        normalize=bool(meta.get(f"{arch}.expert_weights_norm", True)),
        shared_intermediate_size=size(
            shared, f"{arch}.expert_shared_feed_forward_length", "intermediate_size"
        ),
        shared_gate=True,
    )


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    return hybrid_from_gguf(meta, vocab_size, tiled_v_heads=False, moe=moe_from_gguf(meta))


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    # Qwen3NextConfig's default is True, as every released checkpoint has it
    moe = moe_from_hf(cfg, bool(cfg.get("text_config", cfg).get("norm_topk_prob", True)))
    return hybrid_from_hf(cfg, "qwen3next", moe=moe)


FAMILY = Family(
    gguf_arch="qwen3next",
    hf_architectures=("Qwen3NextForCausalLM",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
    adapt_hf_tensors=adapt_hf_tensors,
    adapt_gguf_tensors=adapt_gguf_tensors,
)
