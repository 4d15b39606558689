"""Shape and spec records that the models, layers, backends and kernels all take: data only, a leaf.

`ModelConfig` (models/config.py) holds them; the floors below the models read them from here, so no
backend or kernel imports the models package.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RopeScaling:
    kind: str  # "linear" | "llama3" | "yarn"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    beta_fast: float = 32.0  # YaRN's ramp between extrapolated and interpolated frequencies
    beta_slow: float = 1.0
    truncate: bool = True  # YaRN: round the ramp's ends to whole dimensions (GPT-OSS: False)


@dataclass(frozen=True)
class MoeSpec:
    """A mixture-of-experts feed-forward: `num_used` of `num_experts` experts per token."""

    num_experts: int
    num_used: int
    intermediate_size: int  # of one expert
    # "softmax_topk": softmax over all experts, then the top k (renormalised when `normalize`) (Qwen3-MoE);
    # "topk_softmax": the top k logits, then a softmax over those k (GPT-OSS).
    routing: str = "softmax_topk"
    normalize: bool = True
    activation: str = "silu"  # or "swiglu_oai": GPT-OSS's clamped swish-gated unit
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    # A shared expert every token goes through beside the routed ones (Qwen3-Next, Qwen3.5-MoE,
    # Nemotron-H MoE); `shared_gate`: its output scaled by sigmoid(x @ shared_expert_gate) (Qwen).
    shared_intermediate_size: int | None = None
    shared_gate: bool = False
