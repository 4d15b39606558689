"""One architecture-neutral description of a decoder model, read from GGUF or config.json.

The fields are what the shared decoder needs; each family module fills in the parts
its checkpoints leave implicit (Gemma's sliding-window pattern and local RoPE base,
Qwen 2's QKV bias...). `from_gguf` / `from_hf` parse the keys all families share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from app.engine.loader.names import CheckpointError
from app.engine.specs import UNGATED_ACTIVATIONS as UNGATED_ACTIVATIONS

# the records the backends and kernels take too live in a leaf below them; named here for the families
from app.engine.specs import GatedDeltaNetSpec as GatedDeltaNetSpec
from app.engine.specs import Mamba2Spec as Mamba2Spec
from app.engine.specs import MoeSpec as MoeSpec
from app.engine.specs import RopeScaling as RopeScaling

# What a layer's token mixer is: full attention over the paged KV cache, or a recurrent layer that
# keeps a fixed-size state per sequence instead (hybrid models); "none": the layer has no mixer
# (Nemotron-H's MLP-only layers).
MIXER_ATTENTION = "attention"
MIXER_GATED_DELTANET = "gated_deltanet"  # Qwen3.5, Qwen3-Next (layer_types "linear_attention")
MIXER_MAMBA2 = "mamba2"  # Nemotron-H, Granite 4 hybrid
MIXER_NONE = "none"
RECURRENT_MIXERS = (MIXER_GATED_DELTANET, MIXER_MAMBA2)
# What a layer's feed-forward is: "dense" (gated MLP), "moe" (cfg.moe), "none" (a mixer-only layer).
FFN_DENSE, FFN_MOE, FFN_NONE = "dense", "moe", "none"
# An attention output gate's own projection (`gate_proj`): softplus, one per head or per element (Laguna),
# or sigmoid per element (Muse Glimmer).
GATE_SOFTPLUS_HEAD, GATE_SOFTPLUS, GATE_SIGMOID = "softplus_head", "softplus", "sigmoid"
GATE_PROJ_KINDS = (GATE_SOFTPLUS_HEAD, GATE_SOFTPLUS, GATE_SIGMOID)


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
    residual_scale: float | None = None  # sublayer outputs scaled before the residual add (Granite)
    logit_scale: float | None = None  # logits divided by it (Granite's logits_scaling)
    moe: MoeSpec | None = None  # mixture-of-experts feed-forward in every layer
    attention_sinks: bool = False  # a learned per-head logit in each softmax's denominator (GPT-OSS)
    # Multimodal RoPE (Qwen2.5-VL): frequencies per t/h/w section, each rotated by its own position
    mrope_section: tuple[int, ...] = ()
    # Hybrid models: per layer, its mixer (MIXER_*) and its feed-forward (FFN_*); empty means every
    # layer is attention + (moe if `moe` else dense), as in every pre-hybrid family.
    layer_mixers: tuple[str, ...] = ()
    layer_ffns: tuple[str, ...] = ()
    gated_deltanet: GatedDeltaNetSpec | None = None
    mamba2: Mamba2Spec | None = None
    # Attention output gate (Qwen3.5, Qwen3-Next): q_proj gives each head's query and a gate side by
    # side; the attention output is multiplied by sigmoid(gate) before o_proj.
    attn_output_gate: bool = False
    rotary_dim: int | None = None  # partial RoPE: only the first rotary_dim dims of a head rotate
    # Per-layer attention geometry (Gemma 4: global layers have a head size and KV head count of
    # their own); empty: every layer has `head_dim` and `num_kv_heads`.
    layer_head_dims: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    # KV shared across layers (Gemma 4's `num_kv_shared_layers`): layer i attends over the cache of
    # layer kv_sources[i] and writes none of its own; empty: every attention layer owns its cache.
    kv_sources: tuple[int, ...] = ()
    # Per layer: its values are its key projection (Gemma 4's `attention_k_eq_v`, global layers).
    layer_values_from_keys: tuple[bool, ...] = ()
    value_norm: bool = False  # values RMS-normalised (no learned scale) before they are cached (Gemma 4)
    # Proportional RoPE on the global (non-sliding) layers (Gemma 4): the share of a head's frequency
    # pairs that rotate; the rest keep frequency 0 (they pass unrotated).
    global_rope_fraction: float | None = None
    per_layer_input_size: int = 0  # per-layer input embeddings (Gemma 4's PLE), per layer and token
    # The token whose per-layer inputs an image's (or audio's) soft tokens take: transformers looks the
    # pad token up there, and projects the rest from the soft token itself (Gemma 4).
    per_layer_pad_id: int = 0
    # Image spans attend both ways on sliding layers only; global layers stay causal over them (Gemma 4's
    # use_bidirectional_attention "vision"; Gemma 3's spans hold on every layer).
    image_spans_sliding_only: bool = False
    layer_output_scale: bool = False  # each layer's output stream times a learned scalar (Gemma 4)
    moe_beside_mlp: bool = False  # experts added to the dense MLP's output in every layer (Gemma 4)
    layer_intermediate_sizes: tuple[
        int, ...
    ] = ()  # per layer, where MLP widths differ (Gemma 4's double-wide)
    # Blocks a file holds past num_layers that the decoder does not run (the multi-token-prediction block
    # llama.cpp's converter appends to Qwen3.5 GGUFs: `nextn_predict_layers`); their tensors stay unread.
    trailing_blocks: int = 0
    use_rope: bool = True  # False: attention without positions (NoPE: Nemotron-H, Granite 4.0-H)
    # Per-layer query head counts (Laguna's `num_attention_heads_per_layer`); empty: every layer has
    # `num_heads` (which is then the largest layer's, what the memory plan counts).
    layer_num_heads: tuple[int, ...] = ()
    # An attention output gate from its own projection (`attn_gate`) of the layer's normed input, times the
    # attention output before attn_output (GATE_PROJ_KINDS: Laguna's softplus per head or per element, Muse
    # Glimmer's sigmoid per element); None: no such gate.
    gate_proj: str | None = None
    # Muse Glimmer: the embeddings RMS-normalised without a scale; the sandwich norms after attention and the
    # MLP with an epsilon of their own (None: rms_norm_eps); per layer, attention without RoPE (NoPE).
    embedding_norm: bool = False
    post_norm_eps: float | None = None
    layer_nope: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"{self.num_heads} attention heads do not divide into {self.num_kv_heads} KV heads"
            )

    @property
    def attention_scale(self) -> float:
        return self.query_scale if self.query_scale is not None else 1.0 / math.sqrt(self.head_dim)

    def is_nope(self, layer: int) -> bool:
        return not self.use_rope or (bool(self.layer_nope) and self.layer_nope[layer])

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_sliding) and self.layer_sliding[layer]

    def mixer(self, layer: int) -> str:
        return self.layer_mixers[layer] if self.layer_mixers else MIXER_ATTENTION

    def ffn(self, layer: int) -> str:
        if self.layer_ffns:
            return self.layer_ffns[layer]
        return FFN_MOE if self.moe is not None and not self.moe_beside_mlp else FFN_DENSE

    def head_dim_of(self, layer: int) -> int:
        return self.layer_head_dims[layer] if self.layer_head_dims else self.head_dim

    def intermediate_of(self, layer: int) -> int:
        return (
            self.layer_intermediate_sizes[layer] if self.layer_intermediate_sizes else self.intermediate_size
        )

    @property
    def gate_rows_per_head(self) -> int:
        """Rows of `attn_gate` per query head: 1 for a gate per head, else the head's dims."""
        return 1 if self.gate_proj == GATE_SOFTPLUS_HEAD else self.head_dim

    def heads_of(self, layer: int) -> int:
        return self.layer_num_heads[layer] if self.layer_num_heads else self.num_heads

    def kv_heads_of(self, layer: int) -> int:
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_kv_heads

    def kv_source(self, layer: int) -> int:
        """The layer whose KV cache `layer` attends over (itself unless it shares another's)."""
        return self.kv_sources[layer] if self.kv_sources else layer

    def kv_shape(self, layer: int) -> tuple[int, int] | None:
        """(KV heads, head dim) of the KV cache `layer` owns; None where it owns none (a recurrent
        or mixer-less layer, or one that reads another layer's cache)."""
        if self.mixer(layer) != MIXER_ATTENTION or self.kv_source(layer) != layer:
            return None
        return self.kv_heads_of(layer), self.head_dim_of(layer)

    @property
    def kv_layer_shapes(self) -> tuple[tuple[int, int], ...]:
        """(KV heads, head dim) of every KV cache the model owns, in layer order: what one token costs
        in the KV pool (no entry for recurrent layers, nor for layers reading another's cache)."""
        return tuple(shape for i in range(self.num_layers) if (shape := self.kv_shape(i)) is not None)

    @property
    def is_hybrid(self) -> bool:
        """Whether some layer keeps a recurrent state per sequence (a state cache beside the KV)."""
        return any(m in RECURRENT_MIXERS for m in self.layer_mixers)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that own a KV cache."""
        return tuple(i for i in range(self.num_layers) if self.mixer(i) == MIXER_ATTENTION)

    def state_shapes(self, layer: int) -> tuple[tuple[int, ...], ...] | None:
        """Per-sequence recurrent state shapes of `layer` (float32), None for a layer without state."""
        kind = self.mixer(layer)
        if kind == MIXER_GATED_DELTANET:
            assert self.gated_deltanet is not None
            return self.gated_deltanet.state_shapes()
        if kind == MIXER_MAMBA2:
            assert self.mamba2 is not None
            return self.mamba2.state_shapes()
        return None

    @property
    def state_bytes_per_sequence(self) -> int:
        """float32 bytes of one sequence's recurrent state over every layer (0: no recurrent layers)."""
        total = 0
        for layer in range(self.num_layers):
            for shape in self.state_shapes(layer) or ():
                total += 4 * math.prod(shape)
        return total

    def with_overrides(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)


# The largest value of each size a real checkpoint has, with room to spare: beyond it the file is
# corrupt (a context of 2**40 positions would ask numpy for terabytes of RoPE tables).
LIMITS: dict[str, int] = {
    "vocab_size": 1 << 22,
    "hidden_size": 1 << 17,
    "num_layers": 1024,
    "num_heads": 4096,
    "num_kv_heads": 4096,
    "head_dim": 4096,
    "intermediate_size": 1 << 20,
    "context_length": 1 << 24,
    "num_experts": 4096,
}
# Where each size lives in the checkpoint's own terms, for errors that name it.
GGUF_KEYS = {
    "hidden_size": "embedding_length",
    "num_layers": "block_count",
    "num_heads": "attention.head_count",
    "num_kv_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "intermediate_size": "feed_forward_length",
    "context_length": "context_length",
}
HF_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "intermediate_size": "intermediate_size",
    "context_length": "max_position_embeddings",
}
_REQUIRED = object()


def size(value: Any, key: str, field: str) -> int:
    """`value` as a size for `field`: a whole number from 1 to LIMITS[field]; CheckpointError naming `key`."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= LIMITS[field]:
        raise CheckpointError(f"{key} is {value!r}: it must be a whole number from 1 to {LIMITS[field]}")
    return value


def positive_number(value: Any, key: str) -> float:
    """A finite number above zero (a norm epsilon, a RoPE base); CheckpointError naming `key`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise CheckpointError(f"{key} is {value!r}: it must be a finite number above 0")
    return float(value)


def positive_integer(value: Any, where: str) -> int:
    """A whole number above zero (an encoder's size, a feature extractor's setting), numpy's integers as a GGUF
    reader gives them included; CheckpointError naming `where` (file and key) otherwise."""
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"{where} is {value!r}, not a positive integer")
    return int(value)


def kv_heads(heads: int, kv: int, heads_key: str, kv_key: str) -> int:
    """The KV head count, which must divide the query heads (grouped-query attention)."""
    if heads % kv:
        raise CheckpointError(f"{heads_key} = {heads} is not a multiple of {kv_key} = {kv}")
    return kv


def common_from_gguf(meta: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The keys every GGUF decoder has, as ModelConfig keyword arguments (checked: CheckpointError
    naming the key whose value no real model has)."""
    arch = meta["general.architecture"]

    def key(field: str) -> str:
        return f"{arch}.{GGUF_KEYS[field]}"

    def read(field: str, default: Any = _REQUIRED) -> int:
        if key(field) not in meta and default is _REQUIRED:
            raise CheckpointError(f"metadata has no {key(field)}")
        return size(meta.get(key(field), default), key(field), field)

    def number(key: str, default: float) -> float:
        return positive_number(meta.get(f"{arch}.{key}", default), f"{arch}.{key}")

    hidden, heads = read("hidden_size"), read("num_heads")
    kwargs: dict[str, Any] = dict(
        architecture=arch,
        vocab_size=size(vocab_size, "token_embd.weight rows", "vocab_size"),
        hidden_size=hidden,
        num_layers=read("num_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads(heads, read("num_kv_heads", heads), key("num_heads"), key("num_kv_heads")),
        head_dim=read("head_dim", max(hidden // heads, 1)),
        intermediate_size=read("intermediate_size"),
        rms_norm_eps=number("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=number("rope.freq_base", 10000.0),
        context_length=read("context_length", 4096),
    )
    window = meta.get(f"{arch}.attention.sliding_window")
    if window:
        kwargs["sliding_window"] = size(window, f"{arch}.attention.sliding_window", "context_length")
    scaling_type = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if scaling_type == "linear" and factor:
        kwargs["rope_scaling"] = RopeScaling("linear", positive_number(factor, f"{arch}.rope.scaling.factor"))
    return kwargs


def yarn_from_gguf(meta: dict[str, Any], truncate: bool = True) -> RopeScaling | None:
    """YaRN from llama.cpp's `rope.scaling.*` keys (None when the type is not yarn); GGUF has no key for
    transformers' `truncate`, so the family says it."""
    arch = meta["general.architecture"]
    if meta.get(f"{arch}.rope.scaling.type") != "yarn":
        return None
    for key in ("rope.scaling.factor", "rope.scaling.original_context_length"):
        if f"{arch}.{key}" not in meta:
            raise CheckpointError(f"metadata has no {arch}.{key} (its RoPE is YaRN)")
    return RopeScaling(
        "yarn",
        positive_number(meta[f"{arch}.rope.scaling.factor"], f"{arch}.rope.scaling.factor"),
        original_max_position=size(
            meta[f"{arch}.rope.scaling.original_context_length"],
            f"{arch}.rope.scaling.original_context_length",
            "context_length",
        ),
        beta_fast=float(meta.get(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
        beta_slow=float(meta.get(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)),
        truncate=truncate,
    )


def common_from_hf(cfg: dict[str, Any], architecture: str) -> dict[str, Any]:
    """The keys every Hugging Face decoder config has, as ModelConfig keyword arguments (checked:
    CheckpointError naming the config.json key that is missing or holds no real model's value)."""
    cfg = cfg.get("text_config", cfg)  # multimodal wrappers keep the decoder under text_config

    def key(field: str) -> str:
        return f"config.json {HF_KEYS[field]}"

    def read(field: str, default: Any = _REQUIRED) -> int:
        value = cfg.get(HF_KEYS[field])
        if not value and default is not _REQUIRED:  # null or 0 for an optional key: its default
            value = default
        if value is None:
            raise CheckpointError(f"config.json has no {HF_KEYS[field]}")
        return size(value, key(field), field)

    hidden, heads = read("hidden_size"), read("num_heads")
    kwargs: dict[str, Any] = dict(
        architecture=architecture,
        vocab_size=read("vocab_size"),
        hidden_size=hidden,
        num_layers=read("num_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads(heads, read("num_kv_heads", heads), key("num_heads"), key("num_kv_heads")),
        head_dim=read("head_dim", max(hidden // heads, 1)),
        intermediate_size=read("intermediate_size"),
        rms_norm_eps=positive_number(cfg.get("rms_norm_eps", 1e-6), "config.json rms_norm_eps"),
        rope_theta=positive_number(_hf_rope_theta(cfg), "config.json rope_theta"),
        context_length=read("context_length", 4096),
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
    if kind == "yarn":
        return RopeScaling(
            "yarn",
            float(params["factor"]),
            original_max_position=int(params["original_max_position_embeddings"]),
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            truncate=bool(params.get("truncate", True)),
        )
    if kind not in (None, "default"):
        raise ValueError(f"unsupported RoPE scaling {kind!r}; supported: linear, llama3, yarn")
    return None
