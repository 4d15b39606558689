"""Qwen3-MoE (30B-A3B, 235B-A22B): the Qwen 3 block with a mixture of experts in every layer.

The router takes a softmax over all experts, keeps the top k and renormalises them
(`norm_topk_prob`; llama.cpp always renormalises for this architecture); there is no shared
expert. Layers with a dense MLP (`mlp_only_layers`, `decoder_sparse_step` > 1) occur in no
released checkpoint and are refused by name rather than run wrongly.
"""

from __future__ import annotations

from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.config import ModelConfig, MoeSpec, common_from_gguf, common_from_hf, size
from app.engine.models.family import Family


def _moe(experts: Any, used: Any, ff: Any, normalize: bool, keys: tuple[str, str, str]) -> MoeSpec:
    return MoeSpec(
        num_experts=size(experts, keys[0], "num_experts"),
        num_used=size(used, keys[1], "num_experts"),
        intermediate_size=size(ff, keys[2], "intermediate_size"),
        normalize=normalize,
    )


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    arch = meta["general.architecture"]
    keys = tuple(f"{arch}.{k}" for k in ("expert_count", "expert_used_count", "expert_feed_forward_length"))
    for key in keys:
        if key not in meta:
            raise CheckpointError(f"metadata has no {key}")
    normalize = bool(meta.get(f"{arch}.expert_weights_norm", True))
    moe = _moe(*(meta[k] for k in keys), normalize, keys)  # type: ignore[arg-type]
    return ModelConfig(**common_from_gguf(meta, vocab_size), qk_norm=True, moe=moe)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step", 1)) != 1:
        raise CheckpointError(
            "config.json mlp_only_layers / decoder_sparse_step mix dense and expert layers: not supported"
        )
    # transformers 5 saves num_experts as num_local_experts
    names = ("num_experts" if "num_experts" in cfg else "num_local_experts", "num_experts_per_tok",
             "moe_intermediate_size")  # fmt: skip
    for name in names:
        if name not in cfg:
            raise CheckpointError(f"config.json has no {name}")
    keys = tuple(f"config.json {n}" for n in names)
    # Qwen3MoeConfig's default is False; every released checkpoint sets it True.
    moe = _moe(*(cfg[n] for n in names), bool(cfg.get("norm_topk_prob", False)), keys)  # type: ignore[arg-type]
    return ModelConfig(**common_from_hf(cfg, "qwen3moe"), qk_norm=True, moe=moe)


FAMILY = Family(
    gguf_arch="qwen3moe",
    hf_architectures=("Qwen3MoeForCausalLM",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
)
