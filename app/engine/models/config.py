"""One architecture-neutral description of a decoder model, read from GGUF or config.json.

The fields are what the shared decoder needs; each family module fills in the parts
its checkpoints leave implicit (Gemma's sliding-window pattern and local RoPE base,
Qwen 2's QKV bias...). `from_gguf` / `from_hf` parse the keys all families share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class RopeScaling:
    kind: str  # "linear" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # GGUF name: gemma3, llama, qwen2, qwen3
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    context_length: int
    rope_scaling: RopeScaling | None = None
    rope_interleaved: bool = False  # GGUF llama permutes q/k for adjacent-pair rotation
    rope_theta_local: float | None = None  # sliding-window layers' own base (Gemma 3)
    sliding_window: int | None = None
    layer_sliding: tuple[bool, ...] = ()  # per layer: uses the sliding window
    tie_word_embeddings: bool = False
    embedding_scale: float | None = None  # Gemma multiplies embeddings by sqrt(hidden)
    query_scale: float | None = None  # None: 1/sqrt(head_dim)
    attn_softcap: float | None = None
    final_softcap: float | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    sandwich_norm: bool = False  # extra norms after attention and MLP (Gemma 2/3)
    activation: str = "silu"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"{self.num_heads} attention heads do not divide into {self.num_kv_heads} KV heads"
            )

    @property
    def attention_scale(self) -> float:
        return self.query_scale if self.query_scale is not None else 1.0 / math.sqrt(self.head_dim)

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_sliding) and self.layer_sliding[layer]

    def with_overrides(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)


def _gguf_key(meta: dict[str, Any], arch: str, key: str, default: Any = None) -> Any:
    return meta.get(f"{arch}.{key}", default)


def common_from_gguf(meta: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The keys every GGUF decoder has, as ModelConfig keyword arguments."""
    arch = meta["general.architecture"]
    hidden = int(_gguf_key(meta, arch, "embedding_length"))
    heads = int(_gguf_key(meta, arch, "attention.head_count"))
    head_dim = int(_gguf_key(meta, arch, "attention.key_length", hidden // heads))
    kwargs: dict[str, Any] = dict(
        architecture=arch,
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_layers=int(_gguf_key(meta, arch, "block_count")),
        num_heads=heads,
        num_kv_heads=int(_gguf_key(meta, arch, "attention.head_count_kv", heads)),
        head_dim=head_dim,
        intermediate_size=int(_gguf_key(meta, arch, "feed_forward_length")),
        rms_norm_eps=float(_gguf_key(meta, arch, "attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(_gguf_key(meta, arch, "rope.freq_base", 10000.0)),
        context_length=int(_gguf_key(meta, arch, "context_length", 4096)),
    )
    window = _gguf_key(meta, arch, "attention.sliding_window")
    if window:
        kwargs["sliding_window"] = int(window)
    scaling_type = _gguf_key(meta, arch, "rope.scaling.type")
    factor = _gguf_key(meta, arch, "rope.scaling.factor")
    if scaling_type == "linear" and factor:
        kwargs["rope_scaling"] = RopeScaling("linear", float(factor))
    return kwargs


def common_from_hf(cfg: dict[str, Any], architecture: str) -> dict[str, Any]:
    """The keys every Hugging Face decoder config has, as ModelConfig keyword arguments."""
    cfg = cfg.get("text_config", cfg)  # multimodal wrappers keep the decoder under text_config
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kwargs: dict[str, Any] = dict(
        architecture=architecture,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg["intermediate_size"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(_hf_rope_theta(cfg)),
        context_length=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )
    scaling = _hf_rope_scaling(cfg)
    if scaling is not None:
        kwargs["rope_scaling"] = scaling
    return kwargs


def _hf_rope_theta(cfg: dict[str, Any]) -> float:
    if "rope_theta" in cfg:
        return cfg["rope_theta"]
    params = cfg.get("rope_parameters") or {}
    if "rope_theta" in params:  # transformers 5 moved it here
        return params["rope_theta"]
    if "full_attention" in params:
        return params["full_attention"].get("rope_theta", 10000.0)
    return 10000.0


def _hf_rope_scaling(cfg: dict[str, Any]) -> RopeScaling | None:
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if "full_attention" in params:
        params = params["full_attention"]
    kind = params.get("rope_type") or params.get("type")
    if kind == "linear":
        return RopeScaling("linear", float(params["factor"]))
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            float(params["factor"]),
            float(params.get("low_freq_factor", 1.0)),
            float(params.get("high_freq_factor", 4.0)),
            int(params.get("original_max_position_embeddings", 8192)),
        )
    if kind not in (None, "default"):
        raise ValueError(f"unsupported RoPE scaling {kind!r}; supported: linear, llama3")
    return None
