"""Qwen3.5 (dense): a hybrid of Gated DeltaNet layers and gated full-attention layers.

Most layers are Gated DeltaNet (layers/gated_deltanet.py, `layer_types` "linear_attention"); every
`full_attention_interval`-th one (4 in the released models) is attention whose `q_proj` also gives a
per-head output gate (sigmoid, before `o_proj`), with per-head q/k RMS norms and RoPE on the first
quarter of each head (`partial_rotary_factor` 0.25). Every RMS norm but the Gated DeltaNet's own is
zero-centred: it scales by `1 + w`. llama.cpp's converter stores `1 + w`, as the decoder reads it,
so Hugging Face folders get the +1 here; it also stores -exp(A_log) as `ssm_a`.

The helpers here serve Qwen3-Next and Qwen3.5-MoE too (qwen3next.py, qwen35moe.py): the same layers
with a mixture of experts and a gated shared expert.

File layouts:
- Hugging Face: value heads grouped by the q/k head they share (head h uses q/k head h // r);
  Qwen3-Next fuses `in_proj_qkvz` and `in_proj_ba` per q/k head (split here, as the converter does).
- GGUF (qwen35, qwen35moe): llama.cpp's converter reorders the value heads "tiled" (head h uses q/k
  head h % Hk) in every tensor that has them; the layer follows that order (`tiled_v_heads`).
  qwen3next GGUFs keep the grouped order; old ones hold the fused `ssm_in` (split here).
- MTP (multi-token prediction) weights are no part of the model: in folders skipped by name (names.py); in
  GGUFs, where the converter appends them as the last `nextn_predict_layers` blocks, those blocks are left
  unread. `--speculative mtp` reads them for its drafter (models/mtp.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.layers.attention import take_rows
from app.engine.loader.names import CheckpointError
from app.engine.models.config import (
    MIXER_ATTENTION,
    MIXER_GATED_DELTANET,
    GatedDeltaNetSpec,
    ModelConfig,
    common_from_gguf,
    common_from_hf,
    size,
)
from app.engine.models.family import Family, Tensors
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

_LAYER_TYPES = {"linear_attention": MIXER_GATED_DELTANET, "full_attention": MIXER_ATTENTION}
_ZERO_CENTRED = (".attn_norm.weight", ".ffn_norm.weight", ".attn_q_norm.weight", ".attn_k_norm.weight")


# -- config -------------------------------------------------------------------------------------


def hybrid_from_hf(cfg: dict[str, Any], architecture: str, **extra: Any) -> ModelConfig:
    """The ModelConfig of a Qwen3.5 / Qwen3-Next config.json (`extra`: the family's MoE)."""
    text = cfg.get("text_config", cfg)
    if "intermediate_size" not in text and "moe_intermediate_size" in text:  # Qwen3.5-MoE has no dense MLP
        text = {**text, "intermediate_size": text["moe_intermediate_size"]}
    for key in ("rope_scaling", "rope_parameters"):  # Qwen3.5's M-RoPE sections: plain RoPE for text
        params = text.get(key) or {}
        if (params.get("type") or params.get("rope_type")) == "mrope":
            text = {**text, key: {k: v for k, v in params.items() if k not in ("type", "rope_type")}}
    kwargs = common_from_hf(text, architecture)
    layers = kwargs["num_layers"]
    spec = GatedDeltaNetSpec(
        num_k_heads=_hf_size(text, "linear_num_key_heads"),
        num_v_heads=_hf_size(text, "linear_num_value_heads"),
        head_k_dim=_hf_size(text, "linear_key_head_dim"),
        head_v_dim=_hf_size(text, "linear_value_head_dim"),
        conv_kernel=_hf_size(text, "linear_conv_kernel_dim"),
    )
    layer_types = text.get("layer_types")
    if layer_types:
        unknown = sorted(set(layer_types) - set(_LAYER_TYPES))
        if unknown or len(layer_types) != layers:
            raise CheckpointError(
                f"config.json layer_types must list {layers} of {sorted(_LAYER_TYPES)}; it lists "
                f"{len(layer_types)} ({', '.join(unknown) or 'known kinds'})"
            )
        mixers = tuple(_LAYER_TYPES[t] for t in layer_types)
    else:
        mixers = _every_nth(layers, _hf_size(text, "full_attention_interval", 4))
    params = text.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))
    return _hybrid(kwargs, spec, mixers, int(kwargs["head_dim"] * factor), **extra)


def hybrid_from_gguf(meta: dict[str, Any], vocab_size: int, tiled_v_heads: bool, **extra: Any) -> ModelConfig:
    """The ModelConfig of a qwen35 / qwen35moe / qwen3next GGUF (`extra`: the family's MoE)."""
    arch = meta["general.architecture"]
    blocks = meta.get(f"{arch}.block_count")
    mtp = meta.get(f"{arch}.nextn_predict_layers") or 0  # the converter appends the MTP block(s) last
    if mtp:
        if not isinstance(blocks, int) or not isinstance(mtp, int) or not 0 < mtp < blocks:
            raise CheckpointError(
                f"{arch}.nextn_predict_layers is {mtp!r} of {arch}.block_count {blocks!r}: it must leave layers to run"
            )
        meta = {**meta, f"{arch}.block_count": blocks - mtp}
    if f"{arch}.feed_forward_length" not in meta and f"{arch}.expert_feed_forward_length" in meta:
        meta = {**meta, f"{arch}.feed_forward_length": meta[f"{arch}.expert_feed_forward_length"]}
    kwargs = common_from_gguf(meta, vocab_size)

    def need(key: str, field: str = "head_dim") -> int:
        if f"{arch}.{key}" not in meta:
            raise CheckpointError(f"metadata has no {arch}.{key}")
        return size(meta[f"{arch}.{key}"], f"{arch}.{key}", field)

    num_v = need("ssm.time_step_rank", "num_heads")
    inner = need("ssm.inner_size", "hidden_size")
    if inner % num_v:
        raise CheckpointError(
            f"{arch}.ssm.inner_size {inner} is not a multiple of {arch}.ssm.time_step_rank {num_v}"
        )
    spec = GatedDeltaNetSpec(
        num_k_heads=need("ssm.group_count", "num_heads"),
        num_v_heads=num_v,
        head_k_dim=need("ssm.state_size"),
        head_v_dim=inner // num_v,
        conv_kernel=need("ssm.conv_kernel"),
        tiled_v_heads=tiled_v_heads,
    )
    interval = size(
        meta.get(f"{arch}.full_attention_interval", 4), f"{arch}.full_attention_interval", "num_layers"
    )
    rotary = size(meta.get(f"{arch}.rope.dimension_count", kwargs["head_dim"]), f"{arch}.rope.dimension_count",
                  "head_dim")  # fmt: skip
    return _hybrid(
        kwargs, spec, _every_nth(kwargs["num_layers"], interval), rotary, trailing_blocks=mtp, **extra
    )


def _hybrid(
    kwargs: dict[str, Any], spec: GatedDeltaNetSpec, mixers: tuple[str, ...], rotary: int, **extra: Any
) -> ModelConfig:
    if not 2 <= rotary <= kwargs["head_dim"] or rotary % 2:
        raise CheckpointError(f"a rotary dimension of {rotary} does not fit heads of {kwargs['head_dim']}")
    if spec.num_v_heads % spec.num_k_heads:
        raise CheckpointError(
            f"{spec.num_v_heads} Gated DeltaNet value heads do not divide into {spec.num_k_heads} key heads"
        )
    return ModelConfig(
        **kwargs,
        qk_norm=True,
        attn_output_gate=True,
        rotary_dim=rotary if rotary < kwargs["head_dim"] else None,
        layer_mixers=mixers,
        gated_deltanet=spec,
        **extra,
    )


def _every_nth(layers: int, interval: int) -> tuple[str, ...]:
    """llama.cpp's and transformers' default pattern: layer i is attention when (i + 1) % interval == 0."""
    return tuple(MIXER_ATTENTION if (i + 1) % interval == 0 else MIXER_GATED_DELTANET for i in range(layers))


def _hf_size(cfg: dict[str, Any], key: str, default: Any = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise CheckpointError(f"config.json has no {key}")
    return size(value, f"config.json {key}", "hidden_size")


# -- tensors ------------------------------------------------------------------------------------


def adapt_hf_tensors(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    """Hugging Face values as llama.cpp's converter writes them: `1 + w` norms, -exp(A_log), the conv
    weight `[C, 1, K]` squeezed, fused projections split, stacked experts split into gate and up."""
    out = _split_fused(dict(tensors), cfg)
    for name, tensor in list(out.items()):
        if name.endswith(_ZERO_CENTRED) or name == "output_norm.weight":
            out[name] = _float(name, tensor.dequantize() + 1.0)
        elif name.endswith(".ssm_a"):
            out[name] = _float(name, -np.exp(tensor.dequantize().astype(np.float64)))
        elif name.endswith(".ssm_conv1d.weight") and len(tensor.shape) == 3:
            out[name] = QuantizedTensor(name, tensor.qtype, (tensor.shape[0], tensor.shape[2]), tensor.data)
        elif name.endswith(".ffn_gate_up_exps.weight"):
            del out[name]
            prefix = name.removesuffix(".ffn_gate_up_exps.weight")
            out.update(_split_gate_up(tensor, prefix))
    return out


def _split_gate_up(tensor: QuantizedTensor, prefix: str) -> Tensors:
    """Stacked experts `[E, 2 ff, hidden]` (each expert's gate rows, then its up rows) as GGUF's
    `ffn_gate_exps` and `ffn_up_exps` `[E, ff, hidden]`, rows picked in the file's format (a
    checkpoint's bf16 experts stay bf16)."""
    experts, double, hidden = tensor.shape
    ff = double // 2
    rows = np.arange(experts)[:, None] * double + np.arange(ff)[None, :]
    out = {}
    for part, picked in (("gate", rows), ("up", rows + ff)):
        name = f"{prefix}.ffn_{part}_exps.weight"
        flat = take_rows(
            QuantizedTensor(
                tensor.name, tensor.qtype, (experts * double, hidden), tensor.data, tensor.scales
            ),
            picked.reshape(-1),
            name,
        )
        out[name] = QuantizedTensor(name, flat.qtype, (experts, ff, hidden), flat.data, flat.scales)
    return out


def adapt_gguf_tensors(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    """llama.cpp names the norm before the MLP `post_attention_norm`; Qwen3-Next files hold the fused
    `ssm_ba` (and old ones `ssm_in`)."""
    renamed = {name.replace(".post_attention_norm.", ".ffn_norm."): t for name, t in tensors.items()}
    return _split_fused(renamed, cfg)


def _split_fused(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    """Qwen3-Next's per-q/k-head fused projections as Qwen3.5's separate ones (whole rows picked, so
    quantized files stay in their format): `ssm_in` rows `[q, k, v (r heads), z (r heads)]` per q/k head
    -> `attn_qkv` (all q, all k, all v) and `attn_gate` (z); `ssm_ba` rows `[b (r), a (r)]` per q/k
    head -> `ssm_beta` and `ssm_alpha`."""
    spec = cfg.gated_deltanet
    if spec is None:
        return tensors
    hk, dk, dv, r = spec.num_k_heads, spec.head_k_dim, spec.head_v_dim, spec.num_v_heads // spec.num_k_heads
    for name in [n for n in tensors if n.endswith((".ssm_in.weight", ".ssm_ba.weight"))]:
        tensor = tensors.pop(name)
        prefix = name.rsplit(".", 2)[0]
        if name.endswith(".ssm_in.weight"):
            width = 2 * dk + 2 * r * dv
            parts = _per_head_rows(hk, width, (dk, dk, r * dv, r * dv))
            qkv = np.concatenate(parts[:3])
            tensors[f"{prefix}.attn_qkv.weight"] = take_rows(tensor, qkv, f"{prefix}.attn_qkv.weight")
            tensors[f"{prefix}.attn_gate.weight"] = take_rows(tensor, parts[3], f"{prefix}.attn_gate.weight")
        else:
            b, a = _per_head_rows(hk, 2 * r, (r, r))
            tensors[f"{prefix}.ssm_beta.weight"] = take_rows(tensor, b, f"{prefix}.ssm_beta.weight")
            tensors[f"{prefix}.ssm_alpha.weight"] = take_rows(tensor, a, f"{prefix}.ssm_alpha.weight")
    return tensors


def _per_head_rows(heads: int, width: int, parts: tuple[int, ...]) -> list[np.ndarray]:
    """Row ids of each part, over all heads, of a matrix whose rows are `heads` groups of `parts`."""
    starts = np.cumsum((0, *parts[:-1]))
    return [
        (np.arange(heads)[:, None] * width + start + np.arange(n)[None, :]).reshape(-1)
        for start, n in zip(starts, parts, strict=True)
    ]


def _float(name: str, values: np.ndarray) -> QuantizedTensor:
    return QuantizedTensor.from_float(
        name, np.ascontiguousarray(values, dtype=np.float32), QUANT_TYPES["F32"]
    )


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    return hybrid_from_gguf(meta, vocab_size, tiled_v_heads=True)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    return hybrid_from_hf(cfg, "qwen35")


FAMILY = Family(
    gguf_arch="qwen35",
    hf_architectures=("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
    adapt_hf_tensors=adapt_hf_tensors,
    adapt_gguf_tensors=adapt_gguf_tensors,
)
