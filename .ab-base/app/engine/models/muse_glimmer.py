"""Muse Glimmer (text side), read from config.json (`MuseGlimmerForConditionalGeneration`: its
`text_config`; the vision tower, adapter and projection are models/vision's, muse_glimmer_vision.py) or a GGUF
in llama.cpp's `muse-glimmer` layout.

Gemma-style sandwich norms, with what Muse Glimmer adds:

- sliding layers and full layers without RoPE (NoPE): config.json's `layer_rope_theta` is 0 where a
  layer has none (transformers rotates the others by the one global base); llama.cpp's runs RoPE on the
  sliding layers only (`sliding_window_pattern`, a list or a period);
- the embeddings RMS-normalised without a scale; "centred" norms (`1 + w`: GGUF stores the sum) before and
  after attention and the MLP, the post norms at their own epsilon (`post_norm_eps`, 1e-8 in llama.cpp);
  the final norm a plain `w`;
- QK norms without a scale, the queries times `qk_scale_factor` (folded into the attention scale here;
  llama.cpp's converter writes it as the query norm's weight, the key norm's as ones);
- the attention output times sigmoid(`gate_proj` x) per element (GGUF `attn_gate`);
- logits times `output_multiplier` (GGUF `logit_scale`), then tanh-softcapped.

llama.cpp's converter permutes q/k rows for its interleaved rotation, as for llama.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.loader.names import CheckpointError
from app.engine.models.config import (
    GATE_SIGMOID,
    ModelConfig,
    common_from_gguf,
    common_from_hf,
    positive_number,
    size,
)
from app.engine.models.family import Family, Tensors
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

F32 = QUANT_TYPES["F32"]
POST_NORM_EPS = 1e-8  # MuseGlimmerTextConfig's default; llama.cpp's graph fixes it
SWA_PERIOD = 4  # llama.cpp's default period: the last layer of every 4 is full
CENTRED_NORMS = ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")


def _flags(kwargs: dict[str, Any], sliding: tuple[bool, ...], nope: tuple[bool, ...], multiplier: Any,
           softcap: Any, key: str) -> dict[str, Any]:  # fmt: skip
    kwargs.update(
        sandwich_norm=True,
        qk_norm=True,
        embedding_norm=True,
        gate_proj=GATE_SIGMOID,
        layer_sliding=sliding,
        layer_nope=nope if any(nope) else (),
        logit_scale=1.0 / positive_number(multiplier, key),
        final_softcap=softcap or None,
    )
    return kwargs


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    text = cfg.get("text_config", cfg)
    if text.get("hidden_activation", "silu") != "silu":
        raise CheckpointError(f"config.json hidden_activation is {text['hidden_activation']!r}: only 'silu'")
    kwargs = common_from_hf(text, "muse-glimmer")
    layers = kwargs["num_layers"]
    types = text.get("layer_types") or [
        "full_attention" if (layers - 1 - i) % SWA_PERIOD == 0 else "sliding_attention" for i in range(layers)
    ]
    thetas = text.get("layer_rope_theta") or [0 if t == "full_attention" else 1 for t in types]
    for key, values in (("layer_types", types), ("layer_rope_theta", thetas)):
        if not isinstance(values, list) or len(values) != layers:
            raise CheckpointError(f"config.json {key} must list one entry per layer ({layers})")
    sliding = tuple(t == "sliding_attention" for t in types)
    kwargs = _flags(
        kwargs,
        sliding,
        tuple(not theta for theta in thetas),
        text.get("output_multiplier", 1.0),
        text.get("final_logit_softcapping"),
        "config.json output_multiplier",
    )
    kwargs.update(
        sliding_window=size(text.get("sliding_window"), "config.json sliding_window", "context_length"),
        post_norm_eps=positive_number(text.get("post_norm_eps", POST_NORM_EPS), "config.json post_norm_eps"),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        query_scale=positive_number(text.get("qk_scale_factor", 1.0), "config.json qk_scale_factor")
        / np.sqrt(kwargs["head_dim"]),
    )
    return ModelConfig(**kwargs)


def config_from_gguf(meta: dict[str, Any], vocab_size: int) -> ModelConfig:
    arch = meta["general.architecture"]
    kwargs = common_from_gguf(meta, vocab_size)
    layers = kwargs["num_layers"]
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = meta.get(key, SWA_PERIOD)
    if isinstance(pattern, list | tuple | np.ndarray):
        if len(pattern) != layers:
            raise CheckpointError(f"{key} lists {len(pattern)} layers, not {layers}")
        sliding = tuple(bool(s) for s in pattern)
    else:  # llama.cpp's set_swa_pattern: the last layer of every period is full
        period = size(pattern, key, "num_layers")
        sliding = tuple(i % period < period - 1 for i in range(layers))
    if f"{arch}.logit_scale" not in meta:
        raise CheckpointError(f"metadata has no {arch}.logit_scale (Muse Glimmer's output multiplier)")
    kwargs = _flags(
        kwargs,
        sliding,
        tuple(not s for s in sliding),  # llama.cpp: RoPE on the sliding layers, NoPE on the full ones
        meta[f"{arch}.logit_scale"],
        meta.get(f"{arch}.final_logit_softcapping"),
        f"{arch}.logit_scale",
    )
    theta = meta.get(f"{arch}.rope.freq_base_swa")
    kwargs.update(
        post_norm_eps=POST_NORM_EPS,
        rope_interleaved=True,
        rope_theta_local=None if theta is None else positive_number(theta, f"{arch}.rope.freq_base_swa"),
    )
    if not kwargs.get("sliding_window"):
        raise CheckpointError(f"metadata has no {arch}.attention.sliding_window")
    return ModelConfig(**kwargs)


def adapt_hf_tensors(tensors: Tensors, cfg: ModelConfig) -> Tensors:
    """The layer norms compute with `1 + w` (GGUF stores the sum); the QK norms have no weights (ones here;
    `qk_scale_factor` is in the attention scale)."""
    adapted = dict(tensors)
    for name, tensor in tensors.items():
        if name.startswith("blk.") and name.split(".")[2] in CENTRED_NORMS:
            adapted[name] = QuantizedTensor.from_float(name, tensor.dequantize() + np.float32(1.0), F32)
    ones = np.ones(cfg.head_dim, np.float32)
    for layer in range(cfg.num_layers):
        for part in ("attn_q_norm", "attn_k_norm"):
            name = f"blk.{layer}.{part}.weight"
            adapted[name] = QuantizedTensor.from_float(name, ones, F32)
    return adapted


FAMILY = Family(
    gguf_arch="muse-glimmer",
    hf_architectures=("MuseGlimmerForConditionalGeneration",),
    config_from_gguf=config_from_gguf,
    config_from_hf=config_from_hf,
    adapt_hf_tensors=adapt_hf_tensors,
)
