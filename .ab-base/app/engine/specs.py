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


# Activations of a plain `down(act(up(x)))` MLP and experts, which have no gate projection
# (Nemotron-H's squared ReLU); every other activation gates: `down(act(gate(x)) * up(x))`.
UNGATED_ACTIVATIONS = ("relu2",)


@dataclass(frozen=True)
class MoeSpec:
    """A mixture-of-experts feed-forward: `num_used` of `num_experts` experts per token."""

    num_experts: int
    num_used: int
    intermediate_size: int  # of one expert
    # "softmax_topk": softmax over all experts, then the top k (renormalised when `normalize`) (Qwen3-MoE);
    # "topk_softmax": the top k logits, then a softmax over those k (GPT-OSS);
    # "sigmoid_grouped": sigmoid scores; the top k of scores + a per-expert bias (`exp_probs_b`) among
    # the experts of the best `topk_groups` of `num_groups` groups, weighted by their scores
    # (renormalised when `normalize`) times `routed_scale` (Nemotron-H, DeepSeek-V3 style).
    routing: str = "softmax_topk"
    normalize: bool = True
    num_groups: int = 1
    topk_groups: int = 1
    routed_scale: float = 1.0
    activation: str = "silu"  # or "swiglu_oai": GPT-OSS's clamped swish-gated unit; "relu2": ungated
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    # A shared expert every token goes through beside the routed ones (Qwen3-Next, Qwen3.5-MoE,
    # Nemotron-H MoE); `shared_gate`: its output scaled by sigmoid(x @ shared_expert_gate) (Qwen).
    shared_intermediate_size: int | None = None
    shared_gate: bool = False
    # Nemotron 3 Super: the routed experts work in a smaller space, `ffn_latent_down` before them and
    # `ffn_latent_up` after (the router and the shared expert see the hidden state itself).
    latent_size: int | None = None
    # The router's logits tanh-softcapped (`cap * tanh(logit / cap)`) before routing (Laguna's
    # `moe_router_logit_softcapping`); 0: none.
    router_softcap: float = 0.0


@dataclass(frozen=True)
class GatedDeltaNetSpec:
    """Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next): a short causal conv over q/k/v, then
    the gated delta rule. Per sequence it keeps the conv's last `conv_kernel - 1` inputs and a
    `[num_v_heads, head_k_dim, head_v_dim]` recurrent state."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    # Which value heads a q/k head serves (num_v_heads > num_k_heads): consecutive ones (Hugging Face),
    # or every num_k_heads-th one (llama.cpp's Qwen3.5 GGUFs reorder value heads "tiled").
    tiled_v_heads: bool = False

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Per-sequence (conv state, recurrent state) shapes, float32."""
        return (self.conv_dim, self.conv_kernel - 1), (self.num_v_heads, self.head_k_dim, self.head_v_dim)


@dataclass(frozen=True)
class Mamba2Spec:
    """Mamba-2 (SSD) mixer (Nemotron-H, Granite 4 hybrid): a causal conv over x/B/C, then the
    selective state-space scan. Per sequence it keeps the conv's last `conv_kernel - 1` inputs and a
    `[num_heads, head_dim, state_size]` SSM state."""

    num_heads: int
    head_dim: int
    state_size: int  # d_state
    n_groups: int
    conv_kernel: int
    chunk_size: int = 256  # the SSD chunk length of the chunked (prefill) form

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.state_size

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Per-sequence (conv state, SSM state) shapes, float32."""
        return (self.conv_dim, self.conv_kernel - 1), (self.num_heads, self.head_dim, self.state_size)
