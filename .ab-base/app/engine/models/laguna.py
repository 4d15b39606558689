"""Laguna (poolside's coding MoE: Laguna-XS.2, Laguna-M.1), read from config.json or a GGUF in
llama.cpp's `laguna` layout.

A pre-norm block (no sandwich norms) with QK norms and:

- per-layer query head counts (`num_attention_heads_per_layer`; GGUF: `attention.head_count` as an
  array), one KV head count;
- sliding and full layers (`layer_types`; GGUF: `sliding_window_pattern`, a period whose first layer is
  full, or a list), each kind with its own RoPE: full layers rotate the first `partial_rotary_factor` of
  each head (GGUF: `rope.dimension_count`) at their own base, with YaRN where configured (GGUF:
  `rope.scaling.*`), sliding ones the whole head at theirs (`rope.freq_base_swa`), never scaled;
- a softplus output gate from its own projection (`g_proj`, GGUF `attn_gate`): one gate per head
  (`gating` true or "per-head") or per element ("per-element"; GGUF: told by the tensor's rows);
- dense and sparse MLP layers (`mlp_layer_types`; GGUF: `leading_dense_block_count`): the sparse block
  routes on sigmoid scores plus a correction bias (`e_score_correction_bias`, GGUF `exp_probs_b`),
  weighs the top k by their scores, sum-normalised, times `moe_routed_scaling_factor`, optionally on
  tanh-softcapped logits (config.json only: llama.cpp has no key for it), and adds an always-on SwiGLU
  shared expert without a gate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.loader.names import CheckpointError
from app.engine.models.config import (
    FFN_DENSE,
    FFN_MOE,
    GATE_SOFTPLUS,
    GATE_SOFTPLUS_HEAD,
    ModelConfig,
    MoeSpec,
    common_from_gguf,
    common_from_hf,
    positive_number,
    size,
    yarn_from_gguf,
)
from app.engine.models.family import Family, Tensors

_GATES = {True: GATE_SOFTPLUS_HEAD, "per-head": GATE_SOFTPLUS_HEAD, "per_head": GATE_SOFTPLUS_HEAD,
          "per-element": GATE_SOFTPLUS, "per_element": GATE_SOFTPLUS}  # fmt: skip
_FFNS = {"dense": FFN_DENSE, "sparse": FFN_MOE}
SWA_PERIOD = 4  # llama.cpp's default: full at layer % 4 == 0, the rest sliding (Laguna-XS.2)
GGUF_SIGMOID_GATING = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID


def _per_layer(values: Any, layers: int, key: str) -> list[Any]:
    if not isinstance(values, list | tuple | np.ndarray) or len(values) != layers:
        raise CheckpointError(f"{key} must list one entry per layer ({layers})")
    return list(values)


def _head_counts(heads: list[Any], kv: int, key: str) -> tuple[int, ...]:
    counts = tuple(size(int(h), key, "num_heads") for h in heads)
    for layer, count in enumerate(counts):
        if count % kv:
            raise CheckpointError(f"{key}: layer {layer}'s {count} heads do not divide into {kv} KV heads")
    return counts


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    if cfg.get("moe_apply_router_weight_on_input"):
        raise CheckpointError(
            "config.json moe_apply_router_weight_on_input: router weights on the input are not supported"
        )
    if cfg.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json hidden_act is {cfg['hidden_act']!r}: only 'silu' is supported")
    kwargs = common_from_hf(cfg, "laguna")
    layers = kwargs["num_layers"]
    heads = cfg.get("num_attention_heads_per_layer") or [kwargs["num_heads"]] * layers
    head_counts = _head_counts(
        _per_layer(heads, layers, "config.json num_attention_heads_per_layer"),
        kwargs["num_kv_heads"],
        "config.json num_attention_heads_per_layer",
    )
    types = _per_layer(
        cfg.get("layer_types") or ["full_attention"] * layers, layers, "config.json layer_types"
    )
    mlp = _per_layer(
        cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1),
        layers,
        "config.json mlp_layer_types",
    )
    unknown = sorted({str(t) for t in mlp if t not in _FFNS})
    if unknown:
        raise CheckpointError(f"config.json mlp_layer_types has {unknown}; known: dense, sparse")
    gating = cfg.get("gating", True)
    if gating not in _GATES:
        raise CheckpointError(f"config.json gating is {gating!r}: true, 'per-head' or 'per-element'")
    params = cfg.get("rope_parameters") or {}
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    sliding = tuple(t == "sliding_attention" for t in types)
    if any(sliding) and float(local.get("partial_rotary_factor", 1.0)) != 1.0:
        raise CheckpointError("config.json rope_parameters: partial RoPE on sliding layers is not supported")
    kwargs.update(
        num_heads=max(head_counts),
        layer_num_heads=head_counts if len(set(head_counts)) > 1 else (),
        qk_norm=True,
        gate_proj=_GATES[gating],
        layer_sliding=sliding if any(sliding) else (),
        layer_ffns=tuple(_FFNS[t] for t in mlp),
        rotary_dim=_rotary_dim(kwargs["head_dim"], float(full.get("partial_rotary_factor", 1.0))),
        moe=_moe_from_hf(cfg) if FFN_MOE in (_FFNS[t] for t in mlp) else None,
    )
    if any(sliding):
        kwargs.update(
            sliding_window=size(cfg.get("sliding_window"), "config.json sliding_window", "context_length"),
            rope_theta_local=positive_number(
                local.get("rope_theta", 10000.0), "config.json rope_parameters.sliding_attention.rope_theta"
            ),
        )
    return ModelConfig(**kwargs)


def _rotary_dim(head_dim: int, fraction: float) -> int | None:
    rotated = int(head_dim * fraction)
    if not 0 < rotated <= head_dim or rotated % 2:
        raise CheckpointError(f"partial_rotary_factor {fraction} rotates {rotated} of {head_dim} dims")
    return None if rotated == head_dim else rotated


def _moe_from_hf(cfg: dict[str, Any]) -> MoeSpec:
    def need(key: str, field: str = "num_experts") -> int:
        if key not in cfg:
            raise CheckpointError(f"config.json has no {key}")
        return size(cfg[key], f"config.json {key}", field)

    softcap = cfg.get("moe_router_logit_softcapping") or 0.0
    return _moe(
        experts=need("num_experts"),
        used=need("num_experts_per_tok"),
        ff=need("moe_intermediate_size", "intermediate_size"),
        shared=need("shared_expert_intermediate_size", "intermediate_size"),
        scale=positive_number(
            cfg.get("moe_routed_scaling_factor", 1.0), "config.json moe_routed_scaling_factor"
        ),
        softcap=positive_number(softcap, "config.json moe_router_logit_softcapping") if softcap else 0.0,
    )


def _moe(experts: int, used: int, ff: int, shared: int, scale: float, softcap: float = 0.0) -> MoeSpec:
    if used > experts:
        raise CheckpointError(f"{used} experts per token of {experts}: not a routing a real model has")
    return MoeSpec(
        num_experts=experts,
        num_used=used,
        intermediate_size=ff,
        routing="sigmoid_grouped",  # one group: the top k of scores + bias
        normalize=True,
        routed_scale=scale,
        shared_intermediate_size=shared,
        router_softcap=softcap,
    )


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    arch = meta["general.architecture"]
    heads_key = f"{arch}.attention.head_count"
    heads = meta.get(heads_key)
    scalar = dict(meta)
    if isinstance(heads, list | tuple | np.ndarray):
        scalar[heads_key] = int(max(heads))
    kwargs = common_from_gguf(scalar, vocab_size)
    layers, head_dim = kwargs["num_layers"], kwargs["head_dim"]
    if isinstance(heads, list | tuple | np.ndarray):
        counts = _head_counts(_per_layer(heads, layers, heads_key), kwargs["num_kv_heads"], heads_key)
    else:
        counts = (kwargs["num_heads"],) * layers
    dense_key = f"{arch}.leading_dense_block_count"
    dense = int(meta.get(dense_key, 1))
    if not 0 <= dense <= layers:
        raise CheckpointError(f"{dense_key} is {dense} of {layers} layers")
    rotated = size(
        meta.get(f"{arch}.rope.dimension_count", head_dim), f"{arch}.rope.dimension_count", "head_dim"
    )
    yarn = yarn_from_gguf(meta)  # the full layers' (Laguna-XS.2); the sliding layers' RoPE is plain
    if yarn is not None:
        kwargs["rope_scaling"] = yarn
    kwargs.update(
        layer_num_heads=counts if len(set(counts)) > 1 else (),
        qk_norm=True,
        gate_proj=GATE_SOFTPLUS_HEAD,  # until complete_gguf_config reads the gate tensor's rows
        layer_ffns=(FFN_DENSE,) * dense + (FFN_MOE,) * (layers - dense),
        rotary_dim=None if rotated == head_dim else rotated,
        moe=_moe_from_gguf(meta, arch) if dense < layers else None,
    )
    if kwargs.get("sliding_window"):
        kwargs.update(_sliding_from_gguf(meta, arch, layers, head_dim))
    return ModelConfig(**kwargs)


def _sliding_from_gguf(meta: dict[str, Any], arch: str, layers: int, head_dim: int) -> dict[str, Any]:
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = meta.get(key, SWA_PERIOD)
    if isinstance(pattern, list | tuple | np.ndarray):
        sliding = tuple(bool(s) for s in _per_layer(pattern, layers, key))
    else:
        period = size(pattern, key, "num_layers")
        sliding = tuple(i % period != 0 for i in range(layers))
    swa_dims = meta.get(f"{arch}.rope.dimension_count_swa", head_dim)
    if swa_dims != head_dim:
        raise CheckpointError(
            f"{arch}.rope.dimension_count_swa is {swa_dims}: partial RoPE on sliding layers is not supported"
        )
    theta = meta.get(f"{arch}.rope.freq_base_swa", meta.get(f"{arch}.rope.freq_base", 10000.0))
    return dict(layer_sliding=sliding, rope_theta_local=positive_number(theta, f"{arch}.rope.freq_base_swa"))


def _moe_from_gguf(meta: dict[str, Any], arch: str) -> MoeSpec:
    def need(key: str, field: str = "num_experts") -> int:
        if f"{arch}.{key}" not in meta:
            raise CheckpointError(f"metadata has no {arch}.{key}")
        return size(meta[f"{arch}.{key}"], f"{arch}.{key}", field)

    gating = meta.get(f"{arch}.expert_gating_func", GGUF_SIGMOID_GATING)
    if gating != GGUF_SIGMOID_GATING:
        raise CheckpointError(f"{arch}.expert_gating_func is {gating}: Laguna routes on sigmoid scores (2)")
    if not meta.get(f"{arch}.expert_weights_norm", True):
        raise CheckpointError(
            f"{arch}.expert_weights_norm is false: Laguna sum-normalises its expert weights"
        )
    return _moe(
        experts=need("expert_count"),
        used=need("expert_used_count"),
        ff=need("expert_feed_forward_length", "intermediate_size"),
        shared=need("expert_shared_feed_forward_length", "intermediate_size"),
        scale=positive_number(meta.get(f"{arch}.expert_weights_scale", 1.0), f"{arch}.expert_weights_scale"),
    )


def complete_gguf_config(cfg: ModelConfig, tensors: Tensors) -> ModelConfig:
    """llama.cpp tells the gate's kind by the rows of `attn_gate` (a head's count or heads x head_dim)."""
    kinds = set()
    for layer in range(cfg.num_layers):
        name = f"blk.{layer}.attn_gate.weight"
        gate = tensors.get(name)
        if gate is None:
            raise CheckpointError(f"tensor {name!r} (the attention output gate) is missing")
        heads = cfg.heads_of(layer)
        if gate.shape[0] not in (heads, heads * cfg.head_dim):
            raise CheckpointError(
                f"tensor {name!r} has {gate.shape[0]} rows: neither {heads} (per head) nor "
                f"{heads * cfg.head_dim} (per element)"
            )
        kinds.add(GATE_SOFTPLUS_HEAD if gate.shape[0] == heads else GATE_SOFTPLUS)
    if len(kinds) > 1:
        raise CheckpointError("the attention gates are per head on some layers, per element on others")
    return cfg.with_overrides(gate_proj=kinds.pop()) if kinds else cfg


FAMILY = Family(
    gguf_arch="laguna",
    hf_architectures=("LagunaForCausalLM",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
    complete_gguf_config=complete_gguf_config,
)
