"""GPT-OSS (20B, 120B): a mixture of experts with attention sinks.

Every projection has a bias; each head has a learned sink logit in its softmax's denominator;
even layers attend within a sliding window (128), odd ones globally; RoPE is YaRN-scaled (NeoX
halves, no q/k permutation in GGUF). The router keeps the top k logits and takes a softmax over
those k; experts apply a clamped swish-gated unit, `(clamp(up, +-7) + 1) * g * sigmoid(1.702 g)`
with `g = min(gate, 7)`.

Hugging Face folders stack each layer's experts input-major with gate and up interleaved
(`gate_up_proj [E, hidden, 2 ff]`); `adapt_hf_tensors` turns them into GGUF's layout (separate
`ffn_gate_exps` / `ffn_up_exps` `[E, ff, hidden]`, `ffn_down_exps [E, hidden, ff]`), exactly.
"""

from __future__ import annotations

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
    yarn_from_gguf,
)
from app.engine.models.family import Family, Tensors
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

SWIGLU_LIMIT, SWIGLU_ALPHA = 7.0, 1.702  # llama.cpp hard-codes these for the architecture


def _flags(kwargs: dict[str, Any], moe: MoeSpec, sliding: tuple[bool, ...]) -> ModelConfig:
    return ModelConfig(**kwargs, moe=moe, layer_sliding=sliding, attention_sinks=True, qkv_bias=True)


def _alternating(num_layers: int) -> tuple[bool, ...]:
    return tuple(i % 2 == 0 for i in range(num_layers))


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    arch = meta["general.architecture"]
    kwargs = common_from_gguf(meta, vocab_size)

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in meta:
            raise CheckpointError(f"metadata has no {arch}.{key}")
        return meta[f"{arch}.{key}"]

    moe = MoeSpec(
        num_experts=size(need("expert_count"), f"{arch}.expert_count", "num_experts"),
        num_used=size(need("expert_used_count"), f"{arch}.expert_used_count", "num_experts"),
        intermediate_size=size(need("expert_feed_forward_length"), f"{arch}.expert_feed_forward_length",
                               "intermediate_size"),
        routing="topk_softmax", normalize=False, activation="swiglu_oai", swiglu_limit=SWIGLU_LIMIT,
        swiglu_alpha=SWIGLU_ALPHA,
    )  # fmt: skip
    yarn = yarn_from_gguf(meta, truncate=False)  # the released config.json says so; GGUF has no key for it
    if yarn is not None:
        kwargs["rope_scaling"] = yarn
    return _flags(kwargs, moe, _alternating(kwargs["num_layers"]))


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    kwargs = common_from_hf(cfg, "gpt-oss")
    if not cfg.get("sliding_window"):
        raise CheckpointError("config.json has no sliding_window")
    kwargs["sliding_window"] = size(cfg["sliding_window"], "config.json sliding_window", "context_length")
    layer_types = cfg.get("layer_types")
    sliding = (
        tuple(t == "sliding_attention" for t in layer_types)
        if layer_types
        else _alternating(kwargs["num_layers"])
    )
    moe = MoeSpec(
        num_experts=size(cfg.get("num_local_experts", 128), "config.json num_local_experts", "num_experts"),
        num_used=size(cfg.get("num_experts_per_tok", 4), "config.json num_experts_per_tok", "num_experts"),
        intermediate_size=kwargs["intermediate_size"],
        routing="topk_softmax",
        normalize=False,  # the softmax over the k is the weighting: nothing to renormalise
        activation="swiglu_oai",
        swiglu_limit=positive_number(cfg.get("swiglu_limit", SWIGLU_LIMIT), "config.json swiglu_limit"),
        swiglu_alpha=positive_number(cfg.get("swiglu_alpha", SWIGLU_ALPHA), "config.json swiglu_alpha"),
    )
    return _flags(kwargs, moe, sliding)


def _like(name: str, values: np.ndarray, source: QuantizedTensor) -> QuantizedTensor:
    """`values` stored in the source's float type (exact: they are that type's values, rearranged)."""
    qtype = source.qtype if source.qtype.name in ("F32", "F16", "BF16") else QUANT_TYPES["F32"]
    return QuantizedTensor.from_float(name, np.ascontiguousarray(values), qtype)


def adapt_hf_tensors(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    adapted = dict(tensors)
    for name, tensor in tensors.items():
        if ".ffn_gate_up_exps." in name:
            del adapted[name]
            values = tensor.dequantize()
            if name.endswith(".weight"):  # [E, hidden, 2 ff] input-major, columns gate0, up0, gate1, ...
                gate, up = values[..., 0::2].transpose(0, 2, 1), values[..., 1::2].transpose(0, 2, 1)
            else:  # bias [E, 2 ff]
                gate, up = values[..., 0::2], values[..., 1::2]
            kind = name.rsplit(".", 1)[1]
            prefix = name.split(".ffn_gate_up_exps.")[0]
            adapted[f"{prefix}.ffn_gate_exps.{kind}"] = _like(f"{prefix}.ffn_gate_exps.{kind}", gate, tensor)
            adapted[f"{prefix}.ffn_up_exps.{kind}"] = _like(f"{prefix}.ffn_up_exps.{kind}", up, tensor)
        elif name.endswith(".ffn_down_exps.weight"):  # [E, ff, hidden] input-major -> [E, hidden, ff]
            adapted[name] = _like(name, tensor.dequantize().transpose(0, 2, 1), tensor)
    return adapted


def adapt_gguf_tensors(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    """llama.cpp names the norm before the experts `post_attention_norm`; the decoder calls it ffn_norm."""
    return {name.replace(".post_attention_norm.", ".ffn_norm."): t for name, t in tensors.items()}


FAMILY = Family(
    gguf_arch="gpt-oss",
    hf_architectures=("GptOssForCausalLM",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
    adapt_hf_tensors=adapt_hf_tensors,
    adapt_gguf_tensors=adapt_gguf_tensors,
)
