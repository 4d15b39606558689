"""Wrapper of moe.cu: a mixture-of-experts feed-forward on the GPU with no host sync.

`moe_forward` runs route -> count -> offsets -> scatter -> grouped gate and up products -> gated
unit -> grouped down product -> combine, eight launches whose sizes depend only on the token
count (never on how the tokens were routed), so a decode step that holds it can be captured as a
CUDA graph. The experts of one projection are one stacked buffer in their checkpoint's block
format (`StackedExperts`, GGUF's `ffn_*_exps [E, rows, cols]`); layers/moe.py is the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engine.kernels import moe_mma
from app.engine.kernels.gemv import format_defines
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import f32, i32, i64, launch, ptr
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.specs import MoeSpec

MAX_USED = 16  # MOE_MAX_K in moe.cu
WARPS = 4  # rows per block of the grouped products
THREADS = 256
PAD_BYTES = 16  # the format decoders read whole 16-byte words
# moe_gated's `kind` per MoeSpec.activation (relu2: ungated, up and down only)
ACTIVATION_KINDS = {"silu": 0, "swiglu_oai": 1, "relu2": 2, "gelu_tanh": 3}
ROUTING_MODES = {"softmax_topk": 0, "topk_softmax": 1, "sigmoid_grouped": 2}  # moe_route's `mode`
MAX_GROUPS = 64  # MOE_MAX_GROUPS: moe_route's group mask
MAX_SIGMOID_EXPERTS = 512  # MOE_SIG_MAX_EXPERTS: moe_route's per-thread choice values (sigmoid routing)


@dataclass(frozen=True)
class StackedExperts:
    data: Any  # uint8 device buffer: E x rows x row_bytes (+ PAD_BYTES)
    qtype_name: str
    num_experts: int
    n_rows: int
    n_cols: int
    row_bytes: int
    bias: Any | None = None  # float32 [E, rows] or None

    @property
    def expert_stride(self) -> int:
        return self.n_rows * self.row_bytes


def upload_stacked(weight: QuantizedTensor, bias: QuantizedTensor | None = None) -> StackedExperts:
    """A GGUF-stacked expert tensor `[E, rows, cols]` (and its `[E, rows]` bias) on the device."""
    import cupy as cp

    experts, rows, cols = weight.shape
    if cols % 32:
        raise ValueError(f"tensor {weight.name!r}: {cols} columns is not a whole number of 32-weight units")
    flat = np.zeros(weight.data.size + PAD_BYTES, np.uint8)
    flat[: weight.data.size] = np.ascontiguousarray(weight.data).reshape(-1)
    device_bias = None if bias is None else cp.asarray(bias.dequantize().astype(np.float32).reshape(experts, rows))
    return StackedExperts(cp.asarray(flat), weight.qtype.name, experts, rows, cols, weight.data.shape[1], device_bias)


def _kernel(name: str, qtype_name: str = "F32") -> Any:
    return get_kernel("moe.cu", name, format_defines(qtype_name))


def _grid(n: int) -> tuple[int]:
    return (max(1, -(-n // THREADS)),)


def moe_forward(
    x: Any, logits: Any, spec: MoeSpec, gate: StackedExperts | None, up: StackedExperts, down: StackedExperts,
    expert_scale: Any = None, score_bias: Any = None,
) -> Any:  # fmt: skip
    """`[T, hidden]` normalised hidden states and their router logits `[T, E]` -> the experts' sum
    (`gate` None: ungated experts, `down(act(up x))`).
    `expert_scale` (float32 `[E]` on the device, Gemma 4): each expert's output times its own factor;
    `score_bias` (float32 `[E]`, sigmoid routing's `exp_probs_b`: Nemotron-H, Laguna): added to the scores
    it chooses on."""
    chosen, weights = route_scaled(logits, spec, expert_scale, score_bias)
    return moe_experts(x, chosen, weights, spec, gate, up, down)


def route_scaled(logits: Any, spec: MoeSpec, expert_scale: Any = None, score_bias: Any = None) -> tuple[Any, Any]:
    """moe_route, the weights times each chosen expert's `expert_scale` where given (a gather on the
    device, as layers/moe.py scales them: after the normalisation)."""
    chosen, weights = moe_route(logits, spec, score_bias)
    if expert_scale is not None:
        weights = weights * expert_scale[chosen]
    return chosen, weights


def routing_unsupported(spec: MoeSpec) -> str | None:
    """Why moe_route cannot compute this spec's routing (None: it can): its three modes, the sigmoid one
    with up to MAX_SIGMOID_EXPERTS experts in up to MAX_GROUPS equal groups."""
    if spec.routing not in ROUTING_MODES:
        return f"routing {spec.routing!r}"
    groups, n_exp = spec.num_groups, spec.num_experts
    if spec.routing == "sigmoid_grouped" and (
        not 1 <= groups <= MAX_GROUPS or n_exp % groups or n_exp > MAX_SIGMOID_EXPERTS
    ):
        return (f"{n_exp} experts in {groups} groups (the sigmoid router takes up to "
                f"{MAX_SIGMOID_EXPERTS} in up to {MAX_GROUPS} equal groups)")  # fmt: skip
    return None


def routing_supported(spec: MoeSpec) -> bool:
    """Whether moe_route computes this spec's routing (routing_unsupported says why not)."""
    return routing_unsupported(spec) is None


def moe_route(logits: Any, spec: MoeSpec, score_bias: Any = None) -> tuple[Any, Any]:
    """Each token's k expert ids `[T, k]` (int32) and their weights (float32), on the device, as
    moe/ops.py's `route` (the router softcap, score bias, expert groups and routed scale included)."""
    import cupy as cp

    n_tok, k, n_exp = logits.shape[0], spec.num_used, spec.num_experts
    if not 1 <= k <= min(MAX_USED, n_exp):
        raise ValueError(f"{k} experts per token: the kernels take 1 to {min(MAX_USED, n_exp)}")
    if spec.activation not in ACTIVATION_KINDS:
        raise ValueError(f"no MoE kernel for activation {spec.activation!r}")
    reason = routing_unsupported(spec)
    if reason is not None:
        raise ValueError(f"no MoE routing kernel for {reason}")
    chosen = cp.empty((n_tok, k), cp.int32)
    weights = cp.empty((n_tok, k), cp.float32)
    launch(_kernel("moe_route"), _grid(n_tok), (THREADS,),
           (logits, i32(n_tok), i32(n_exp), i32(k), i32(ROUTING_MODES[spec.routing]), i32(spec.normalize),
            ptr(score_bias), f32(spec.router_softcap), f32(spec.routed_scale), i32(spec.num_groups),
            i32(spec.topk_groups), chosen, weights))  # fmt: skip
    return chosen, weights


def moe_experts(
    x: Any,
    chosen: Any,
    weights: Any,
    spec: MoeSpec,
    gate: StackedExperts | None,
    up: StackedExperts,
    down: StackedExperts,
    groups: Any = None,
) -> Any:
    """The routed pairs through the grouped products, gated unit (or, with `gate` None, the ungated
    activation of the up product) and combine.

    `groups` `[T, k]` (int32): the stacked slot each pair's product reads, by default its expert.
    A pair whose group is `gate.num_experts` (one past the last slot) is skipped: its output is 0,
    so one call can run only the experts that are in slots (backend/cuda/experts.py streams the
    rest). The combine adds a token's pairs in expert-id order (`chosen`) either way."""
    import cupy as cp

    kind = ACTIVATION_KINDS.get(spec.activation)
    if kind is None or (gate is None) != (spec.activation == "relu2"):
        raise ValueError(f"activation {spec.activation!r} with{'out' if gate is None else ''} a gate product")
    n_tok, k = x.shape[0], spec.num_used
    n_slots = up.num_experts
    skipping = groups is not None
    groups = chosen if groups is None else groups
    n_groups = n_slots + 1 if skipping else n_slots  # the extra group holds the skipped pairs
    pairs = n_tok * k
    counts = cp.zeros(n_groups, cp.int32)
    offsets = cp.empty(n_groups + 1, cp.int32)
    cursor = cp.empty(n_groups, cp.int32)
    order = cp.empty(pairs, cp.int32)
    where = cp.empty(pairs, cp.int32)
    launch(_kernel("moe_count"), _grid(pairs), (THREADS,), (groups, i32(pairs), counts))
    launch(_kernel("moe_offsets"), (1,), (1,), (counts, i32(n_groups), offsets, cursor))
    launch(_kernel("moe_scatter"), _grid(pairs), (THREADS,), (groups, i32(pairs), cursor, order, where))  # fmt: skip

    def grouped(w: StackedExperts, inputs: Any, per_pair: bool) -> Any:
        y = (cp.zeros if skipping else cp.empty)((pairs, w.n_rows), cp.float32)  # skipped rows stay 0
        # many pairs an expert (by the model's experts, so streamed slots choose as the resident layer): tensor cores
        if moe_mma.serves(w.qtype_name, n_tok, k, spec.num_experts, w.n_cols):
            return moe_mma.grouped_mma(w, inputs, per_pair, order, offsets, k, n_slots, y)
        kernel = _kernel(f"moe_grouped_{w.qtype_name.lower()}", w.qtype_name)
        args = (w.data, i64(w.expert_stride), i64(w.row_bytes), i32(w.n_rows), i32(w.n_cols), inputs,
                i32(per_pair), order, offsets, i32(k), ptr(w.bias), y)  # fmt: skip
        launch(kernel, (-(-w.n_rows // WARPS), n_slots), (32 * WARPS,), args)
        return y

    u = grouped(up, x, False)
    g = u if gate is None else grouped(gate, x, False)  # ungated: relu2's kind reads `up` alone
    act = cp.empty_like(u)
    launch(_kernel("moe_gated"), _grid(u.size), (THREADS,),
           (g, u, i64(u.size), i32(kind), f32(spec.swiglu_limit), f32(spec.swiglu_alpha), act))  # fmt: skip
    h = grouped(down, act, True)
    out = cp.empty((n_tok, down.n_rows), cp.float32)
    launch(_kernel("moe_combine"), (n_tok,), (THREADS,), (h, chosen, weights, where, i32(k), i32(down.n_rows), out))
    return out
