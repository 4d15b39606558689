"""Gemma 4 (text): Gemma 3's block (QK norm, sandwich norms, GELU-tanh, scaled embeddings, tied output,
sliding and global layers) with what Gemma 4 adds, read from config.json or a GGUF in llama.cpp's layout:

- global layers with a head size and KV head count of their own (`global_head_dim`,
  `num_global_key_value_heads`), proportional RoPE there (a quarter of the frequency pairs rotate;
  llama.cpp writes the rest as `rope_freqs` factors of 1e30), queries unscaled (the QK norms scale);
- values RMS-normalised without a learned scale, and on global layers with `attention_k_eq_v` the
  values are the key projection itself (no `v_proj`);
- KV shared across layers (`num_kv_shared_layers`): the last layers read the cache of the last earlier
  layer of their own kind and write none; with `use_double_wide_mlp` their MLP is twice as wide;
- per-layer input embeddings (PLE, the E-series) and a learned scalar on each layer's output;
- a mixture of experts beside the dense MLP (26B-A4B), with a router over the unscaled norm of the
  residual stream times a learned scale, and a learned scale per expert's output.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.engine.loader.names import CheckpointError
from app.engine.models.config import (
    ModelConfig,
    MoeSpec,
    common_from_gguf,
    common_from_hf,
    positive_number,
    size,
)
from app.engine.models.family import Family, Tensors
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

GLOBAL_HEAD_DIM = 512  # Gemma4TextConfig's defaults for what hub configs leave out
SLIDING_PATTERN = 6
LOCAL_ROPE_THETA = 10_000.0
GLOBAL_ROPE_THETA = 1_000_000.0


def kv_sources(sliding: tuple[bool, ...], num_shared: int) -> tuple[int, ...]:
    """Per layer, whose KV it reads: itself, or for each of the last `num_shared` layers the last earlier
    unshared layer of the same kind (sliding or global), as transformers' `kv_sharing_modes`."""
    n = len(sliding)
    if not num_shared:
        return ()
    first_shared = n - num_shared
    if first_shared < 1:
        raise CheckpointError(f"num_kv_shared_layers = {num_shared} leaves no layer that writes a KV cache")
    sources = list(range(n))
    for layer in range(first_shared, n):
        owners = [i for i in range(first_shared) if sliding[i] == sliding[layer]]
        if not owners:
            kind = "sliding" if sliding[layer] else "global"
            raise CheckpointError(
                f"layer {layer} shares the KV of a {kind} layer, but no earlier layer is {kind}"
            )
        sources[layer] = owners[-1]
    return tuple(sources)


def _gemma4_flags(kwargs: dict[str, Any], sliding: tuple[bool, ...]) -> dict[str, Any]:
    kwargs.update(
        qk_norm=True,
        sandwich_norm=True,
        value_norm=True,
        activation="gelu_tanh",
        embedding_scale=math.sqrt(kwargs["hidden_size"]),
        query_scale=1.0,
        layer_sliding=sliding,
        layer_output_scale=True,
        image_spans_sliding_only=True,
    )
    return kwargs


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    text = dict(cfg.get("text_config", cfg))
    params = text.pop("rope_parameters", None) or {}
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    text["rope_theta"] = full.get("rope_theta", GLOBAL_ROPE_THETA)
    kwargs = common_from_hf(text, "gemma4")
    layers = kwargs["num_layers"]
    layer_types = text.get("layer_types") or [
        "sliding_attention" if (i + 1) % SLIDING_PATTERN else "full_attention" for i in range(layers)
    ]
    if len(layer_types) != layers:
        raise CheckpointError(
            f"config.json layer_types lists {len(layer_types)} layers, num_hidden_layers is {layers}"
        )
    sliding = tuple(t == "sliding_attention" for t in layer_types)
    kwargs = _gemma4_flags(kwargs, sliding)
    head_dims, kv_heads = _hf_geometry(text, kwargs, sliding)
    k_eq_v = bool(text.get("attention_k_eq_v", False))
    fraction = full.get("partial_rotary_factor") if full.get("rope_type") == "proportional" else None
    kwargs.update(
        rope_theta_local=float(local.get("rope_theta", LOCAL_ROPE_THETA)),
        sliding_window=size(text.get("sliding_window", 512), "config.json sliding_window", "context_length"),
        final_softcap=text.get("final_logit_softcapping"),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))),
        layer_head_dims=head_dims,
        layer_kv_heads=kv_heads,
        layer_values_from_keys=tuple(k_eq_v and not s for s in sliding),
        kv_sources=kv_sources(sliding, int(text.get("num_kv_shared_layers") or 0)),
        global_rope_fraction=None if fraction is None else float(fraction),
        per_layer_input_size=int(text.get("hidden_size_per_layer_input") or 0),
        per_layer_pad_id=int(text.get("pad_token_id") or 0),
    )
    if text.get("use_double_wide_mlp") and kwargs["kv_sources"]:  # the shared-KV layers' MLPs
        ff = kwargs["intermediate_size"]
        kwargs["layer_intermediate_sizes"] = tuple(
            2 * ff if source != i else ff for i, source in enumerate(kwargs["kv_sources"])
        )
    if text.get("enable_moe_block"):
        kwargs.update(
            moe=_moe(
                text.get("num_experts"),
                text.get("top_k_experts"),
                text.get("moe_intermediate_size"),
                ("config.json num_experts", "config.json top_k_experts", "config.json moe_intermediate_size"),
            ),
            moe_beside_mlp=True,
        )
    return ModelConfig(**kwargs)


def _hf_geometry(
    text: dict[str, Any], kwargs: dict[str, Any], sliding: tuple[bool, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-layer head dims and KV head counts: transformers 5 saves `per_layer_config` (layer -> overrides);
    hub configs give `global_head_dim` and, with `attention_k_eq_v`, `num_global_key_value_heads`."""
    head_dims = [kwargs["head_dim"]] * len(sliding)
    kv_heads = [kwargs["num_kv_heads"]] * len(sliding)
    overrides = text.get("per_layer_config")
    if overrides is None:
        global_heads = text.get("num_global_key_value_heads") if text.get("attention_k_eq_v", True) else None
        override = {"head_dim": text.get("global_head_dim", GLOBAL_HEAD_DIM)}
        if global_heads is not None:
            override["num_key_value_heads"] = global_heads
        overrides = {str(i): override for i, s in enumerate(sliding) if not s}
    for layer, override in overrides.items():
        i = int(layer)
        head_dims[i] = size(override.get("head_dim", head_dims[i]), "config.json global_head_dim", "head_dim")
        kv_heads[i] = size(
            override.get("num_key_value_heads", kv_heads[i]),
            "config.json num_global_key_value_heads",
            "num_kv_heads",
        )
        if kwargs["num_heads"] % kv_heads[i]:
            raise CheckpointError(
                f"layer {i}: {kwargs['num_heads']} heads do not divide into {kv_heads[i]} KV heads"
            )
    return tuple(head_dims), tuple(kv_heads)


def _moe(experts: Any, used: Any, ff: Any, keys: tuple[str, str, str]) -> MoeSpec:
    for value, key in zip((experts, used, ff), keys, strict=True):
        if value is None:
            raise CheckpointError(f"{key} is missing: the experts cannot be built")
    return MoeSpec(
        num_experts=size(experts, keys[0], "num_experts"),
        num_used=size(used, keys[1], "num_experts"),
        intermediate_size=size(ff, keys[2], "intermediate_size"),
        activation="gelu_tanh",
    )


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    arch = meta["general.architecture"]
    key = f"{arch}.attention.head_count_kv"
    per_layer_kv = meta.get(key)
    scalar_meta = dict(meta)
    if isinstance(per_layer_kv, list | tuple | np.ndarray):
        scalar_meta[key] = int(max(per_layer_kv))
    ff = meta.get(f"{arch}.feed_forward_length")
    widths: tuple[int, ...] = ()
    if isinstance(ff, list | tuple | np.ndarray):  # the double-wide MLP of the shared-KV layers
        widths = tuple(size(int(w), f"{arch}.feed_forward_length", "intermediate_size") for w in ff)
        scalar_meta[f"{arch}.feed_forward_length"] = min(widths)
    kwargs = common_from_gguf(scalar_meta, vocab_size)
    layers = kwargs["num_layers"]
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if pattern is None:
        raise CheckpointError(f"metadata has no {arch}.attention.sliding_window_pattern")
    sliding = tuple(bool(s) for s in pattern)
    if len(sliding) != layers:
        raise CheckpointError(
            f"{arch}.attention.sliding_window_pattern lists {len(sliding)} layers, not {layers}"
        )
    kwargs = _gemma4_flags(kwargs, sliding)
    global_dim = kwargs["head_dim"]  # key_length: the global layers'
    local_dim = size(
        meta.get(f"{arch}.attention.key_length_swa", global_dim),
        f"{arch}.attention.key_length_swa",
        "head_dim",
    )
    if isinstance(per_layer_kv, list | tuple | np.ndarray):
        kv = tuple(size(int(h), key, "num_kv_heads") for h in per_layer_kv)
        if len(kv) != layers:
            raise CheckpointError(f"{key} lists {len(kv)} layers, not {layers}")
    else:
        kv = (kwargs["num_kv_heads"],) * layers
    rope_dims = meta.get(f"{arch}.rope.dimension_count", global_dim)
    kwargs.update(
        head_dim=local_dim,
        num_kv_heads=kv[0],
        rope_theta_local=positive_number(
            meta.get(f"{arch}.rope.freq_base_swa", LOCAL_ROPE_THETA), f"{arch}.rope.freq_base_swa"
        ),
        final_softcap=meta.get(f"{arch}.final_logit_softcapping"),
        tie_word_embeddings=True,
        layer_head_dims=tuple(local_dim if s else global_dim for s in sliding),
        layer_kv_heads=kv,
        kv_sources=kv_sources(sliding, int(meta.get(f"{arch}.attention.shared_kv_layers", 0))),
        # Proportional RoPE comes as rope_freqs factors (1e30 for the pairs that do not rotate);
        # a rope.dimension_count below the head's is plain partial rotation, which GGUF Gemma 4 never uses.
        global_rope_fraction=None if rope_dims == global_dim else rope_dims / global_dim,
        per_layer_input_size=int(meta.get(f"{arch}.embedding_length_per_layer_input", 0)),
        per_layer_pad_id=int(meta.get("tokenizer.ggml.padding_token_id") or 0),
        layer_intermediate_sizes=widths if len(set(widths)) > 1 else (),
    )
    if f"{arch}.expert_count" in meta:
        keys = tuple(
            f"{arch}.{k}" for k in ("expert_count", "expert_used_count", "expert_feed_forward_length")
        )
        kwargs.update(moe=_moe(*(meta.get(k) for k in keys), keys), moe_beside_mlp=True)  # type: ignore[arg-type]
    return ModelConfig(**kwargs)


def complete_gguf_config(cfg: ModelConfig, tensors: Tensors) -> ModelConfig:
    """llama.cpp writes no `attention_k_eq_v` key: a global layer whose `attn_v` is absent takes its keys."""
    from_keys = tuple(
        not cfg.is_sliding(i) and cfg.kv_source(i) == i and f"blk.{i}.attn_v.weight" not in tensors
        for i in range(cfg.num_layers)
    )
    return cfg.with_overrides(layer_values_from_keys=from_keys) if any(from_keys) else cfg


def adapt_tensors(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    """Both formats name the same tensors (llama.cpp's names; Gemma 4's norms are plain `w` in both). Here
    the stacked experts become per-expert gate/up/down views, the router's input scale (and transformers'
    1/sqrt(hidden)) is folded into its projection, and the values-from-keys layers get their keys as values."""
    adapted = dict(tensors)
    for layer in range(cfg.num_layers):
        prefix = f"blk.{layer}"
        if cfg.moe is not None:
            _split_experts(adapted, prefix, cfg.moe)
            _fold_router_scale(adapted, prefix, cfg.hidden_size)
        if (
            cfg.layer_values_from_keys
            and cfg.layer_values_from_keys[layer]
            and f"{prefix}.attn_v.weight" not in adapted
        ):
            key = adapted.get(f"{prefix}.attn_k.weight")
            if key is not None:
                adapted[f"{prefix}.attn_v.weight"] = key
    return adapted


def _split_experts(tensors: Tensors, prefix: str, moe: MoeSpec) -> None:
    """`ffn_gate_up_exps [E, 2 ff, hidden]` (gate rows, then up rows, per expert) -> per-expert row views."""
    fused = tensors.pop(f"{prefix}.ffn_gate_up_exps.weight", None)
    if fused is None:
        return
    n, ff = moe.num_experts, moe.intermediate_size
    if fused.shape != (n, 2 * ff, fused.shape[-1]):
        raise CheckpointError(
            f"tensor {prefix}.ffn_gate_up_exps.weight has shape {fused.shape}; expected ({n}, {2 * ff}, hidden)"
        )
    for e in range(n):
        for part, offset in (("gate", 0), ("up", ff)):
            rows = fused.data[e * 2 * ff + offset : e * 2 * ff + offset + ff]
            name = f"{prefix}.ffn_{part}_exps.{e}.weight"
            tensors[name] = QuantizedTensor(name, fused.qtype, (ff, fused.shape[-1]), rows)


def _fold_router_scale(tensors: Tensors, prefix: str, hidden: int) -> None:
    """The router reads `rms_norm(x) * scale / sqrt(hidden)` (an unscaled norm): fold the per-column
    factor into the projection, so the layer only norms."""
    scale = tensors.pop(f"{prefix}.ffn_gate_inp.scale", None)
    router = tensors.get(f"{prefix}.ffn_gate_inp.weight")
    if scale is None or router is None:
        return
    factor = scale.dequantize().reshape(-1).astype(np.float32) * np.float32(hidden**-0.5)
    weight = router.dequantize().astype(np.float32) * factor[None, :]
    name = f"{prefix}.ffn_gate_inp.weight"
    tensors[name] = QuantizedTensor.from_float(name, np.ascontiguousarray(weight), QUANT_TYPES["F32"])


FAMILY = Family(
    gguf_arch="gemma4",
    hf_architectures=("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
    adapt_hf_tensors=adapt_tensors,
    adapt_gguf_tensors=adapt_tensors,
    complete_gguf_config=complete_gguf_config,
)
