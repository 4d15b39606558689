"""Wrapper of moe.cu: a mixture-of-experts feed-forward on the GPU with no host sync.

`moe_forward` runs route -> group (moe_offsets: counts, offsets, the pairs' order and the list of
experts with pairs) -> the gated gate/up product -> the down product -> combine, launches whose
sizes depend only on the token count (never on how the tokens were routed), so a decode step that
holds it can be captured as a CUDA graph: four at small batches (moe_route_grouped routes and groups in
one block), five beyond. At decode (up to FUSED_DECODE_MAX_TOKENS tokens) three, with no grouping:
moe_route, the gate/up product per (token, slot) pair and the down product fused with the combine
(`moe_few_tokens`). The products' grids cover min(slots, pairs) experts and their
blocks find their expert in the active list. The experts of one projection are one stacked
buffer in their checkpoint's block format (`StackedExperts`, GGUF's `ffn_*_exps [E, rows, cols]`);
layers/moe.py is the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engine.kernels import moe_mma
from app.engine.kernels.gemv import format_defines
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import NULL, cdiv, f32, i32, i64, launch, ptr
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.specs import MoeSpec

MAX_USED = 16  # MOE_MAX_K in moe.cu
WARPS = 4  # MOE_WARPS: warps per block of the grouped products
ROWS = 2  # MOE_R: rows of each weight a lane group of the grouped products reads at once (moe.cu says how to A/B it)
ROUTE_WARPS = 4  # tokens per block of moe_route (a warp each)
THREADS = 256
PLAN_THREADS = 1024  # MOE_PLAN_THREADS: moe_offsets and moe_route_grouped are one block of it
PLAN_MAX_GROUPS = 2048  # MOE_PLAN_MAX_GROUPS: moe_offsets' shared counts
ONE_BLOCK_PLAN_PAIRS = 16384  # up to here moe_offsets counts and scatters the pairs itself (one launch)
FUSED_ROUTE_TOKENS = 64  # up to here moe_route_grouped routes (two tokens a warp at most) and groups in one launch
# Up to here (with the fused decode path on) the products index the pairs directly and the down product sums
# them (moe_few_tokens). At 4 tokens x top 8 of Qwen3.5's 256 experts the 32 pairs hit ~30 distinct experts,
# so reading an expert once per pair instead of once per expert costs next to nothing, against the grouping's
# block-wide passes and the combine's launch and [pairs, hidden] round trip saved; from 8 tokens a popular
# expert is read twice as often, and moe_down_combine's grid (row tiles x tokens) grows with the batch while
# each block still reads k experts' rows serially per warp. Decode at c=1..4 is the case it is for.
FUSED_DECODE_MAX_TOKENS = 4
# The formats with integer codes (quant.cuh's codes(): every block format, the float ones not): their grouped
# products can read int16 x (moe_grouped_int_*).
INT_X_FORMATS = moe_mma.FORMATS - {"F32", "F16", "BF16"}
PAD_BYTES = 16  # the format decoders read whole 16-byte words
# moe_gated's `kind` per MoeSpec.activation (relu2: ungated, up and down only)
ACTIVATION_KINDS = {"silu": 0, "swiglu_oai": 1, "relu2": 2, "gelu_tanh": 3}
ROUTING_MODES = {"softmax_topk": 0, "topk_softmax": 1, "sigmoid_grouped": 2}  # moe_route's `mode`
MAX_GROUPS = 64  # MOE_MAX_GROUPS: moe_route's group mask
MAX_EXPERTS = 1024  # 32 x MOE_ROUTE_PER_LANE: moe_route's choice values, in the registers of a warp


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


def _kernel(name: str, qtype_name: str = "F32", max_tokens: int = 4) -> Any:
    """`max_tokens` (MOE_TMAX): the most pairs of one expert a grouped product takes per pass over its rows."""
    return get_kernel("moe.cu", name, {**format_defines(qtype_name), "MOE_TMAX": max_tokens})


def _grid(n: int) -> tuple[int]:
    return (max(1, -(-n // THREADS)),)


@dataclass(frozen=True)
class SharedJoin:
    """A shared expert's output `rows [T, hidden]` (float32, contiguous) joining the routed sum times
    `sigmoid(logit[:, 0])` (`logit [T, >= 1]`, float32, rows of any stride: a column of a fused product)."""

    rows: Any
    logit: Any

    def args(self, n_tok: int, hidden: int) -> tuple[Any, Any, int]:
        if self.rows.shape != (n_tok, hidden) or not self.rows.flags.c_contiguous or self.logit.shape[0] != n_tok:
            raise ValueError(f"shared rows {self.rows.shape} / logits {self.logit.shape} for {n_tok} x {hidden}")
        return self.rows, self.logit, self.logit.strides[0] // 4

    def gated(self) -> Any:
        """rows * sigmoid(logit): output_gate_sigmoid's one launch (the paths that do not join it)."""
        import cupy as cp

        from app.engine.kernels.activation import output_gate

        return output_gate(self.rows, self.logit[:, :1], "sigmoid", cp.empty_like(self.rows))


def moe_forward(
    x: Any, logits: Any, spec: MoeSpec, gate: StackedExperts | None, up: StackedExperts, down: StackedExperts,
    expert_scale: Any = None, score_bias: Any = None, fused_decode: bool = True, shared: SharedJoin | None = None,
    int_x: bool = False,
) -> Any:  # fmt: skip
    """`[T, hidden]` normalised hidden states and their router logits `[T, E]` -> the experts' sum
    (`gate` None: ungated experts, `down(act(up x))`).
    `expert_scale` (float32 `[E]` on the device, Gemma 4): each expert's output times its own factor;
    `score_bias` (float32 `[E]`, sigmoid routing's `exp_probs_b`: Nemotron-H, Laguna): added to the scores
    it chooses on. `fused_decode` (KernelOptions.moe_fused_decode): up to FUSED_DECODE_MAX_TOKENS tokens
    through moe_few_tokens. `shared`: a shared expert's output, gated, added last (in the few-tokens
    path's combine; after the sum elsewhere). `int_x` (KernelOptions.moe_int_x): the grouped products over
    int16 x (grouped_product)."""
    if fused_decode and few_tokens_serve(x.shape[0], spec, gate, up):
        chosen, weights = moe_route(logits, spec, score_bias)  # a warp per token: no grouping
        return moe_few_tokens(x, chosen, weights, spec, gate, up, down, expert_scale, shared)
    if x.shape[0] <= FUSED_ROUTE_TOKENS and up.num_experts == spec.num_experts:
        chosen, weights, plan = route_grouped(logits, spec, score_bias)  # small batches: route and group at once
        routed = moe_experts(x, chosen, weights, spec, gate, up, down, plan=plan, expert_scale=expert_scale,
                             int_x=int_x)  # fmt: skip
    else:
        chosen, weights = route_scaled(logits, spec, expert_scale, score_bias)
        routed = moe_experts(x, chosen, weights, spec, gate, up, down, int_x=int_x)
    return routed if shared is None else routed + shared.gated()


def route_scaled(logits: Any, spec: MoeSpec, expert_scale: Any = None, score_bias: Any = None) -> tuple[Any, Any]:
    """moe_route, the weights times each chosen expert's `expert_scale` where given (a gather on the
    device, as layers/moe.py scales them: after the normalisation)."""
    chosen, weights = moe_route(logits, spec, score_bias)
    if expert_scale is not None:
        weights = weights * expert_scale[chosen]
    return chosen, weights


def routing_unsupported(spec: MoeSpec) -> str | None:
    """Why moe_route cannot compute this spec's routing (None: it can): its three modes over up to
    MAX_EXPERTS experts, the sigmoid one in up to MAX_GROUPS equal groups."""
    if spec.routing not in ROUTING_MODES:
        return f"routing {spec.routing!r}"
    groups, n_exp = spec.num_groups, spec.num_experts
    if n_exp > MAX_EXPERTS:
        return f"{n_exp} experts (the router takes up to {MAX_EXPERTS})"
    if spec.routing == "sigmoid_grouped" and (not 1 <= groups <= MAX_GROUPS or n_exp % groups):
        return f"{n_exp} experts in {groups} groups (the sigmoid router takes up to {MAX_GROUPS} equal ones)"
    return None


def routing_supported(spec: MoeSpec) -> bool:
    """Whether moe_route computes this spec's routing (routing_unsupported says why not)."""
    return routing_unsupported(spec) is None


def _check_routing(spec: MoeSpec) -> None:
    """A ValueError naming what of `spec` the router kernels do not take."""
    k, n_exp = spec.num_used, spec.num_experts
    if not 1 <= k <= min(MAX_USED, n_exp):
        raise ValueError(f"{k} experts per token: the kernels take 1 to {min(MAX_USED, n_exp)}")
    if spec.activation not in ACTIVATION_KINDS:
        raise ValueError(f"no MoE kernel for activation {spec.activation!r}")
    reason = routing_unsupported(spec)
    if reason is not None:
        raise ValueError(f"no MoE routing kernel for {reason}")


def _routing_args(spec: MoeSpec, score_bias: Any, logits: Any) -> tuple:
    """moe_route's arguments after the token count (MoeRouting in moe.cu). `logits` `[T, >= E]`, float32 rows of
    unit column stride: a token's experts are its first E columns (a wider product may carry more)."""
    if logits.ndim != 2 or logits.shape[1] < spec.num_experts or logits.strides[1] != 4 or logits.dtype != np.float32:
        raise ValueError(f"router logits {logits.shape} (strides {logits.strides}) for {spec.num_experts} experts")
    return (i32(spec.num_experts), i32(spec.num_used), i32(ROUTING_MODES[spec.routing]), i32(spec.normalize),
            ptr(score_bias), f32(spec.router_softcap), f32(spec.routed_scale), i32(spec.num_groups),
            i32(spec.topk_groups), i32(logits.strides[0] // 4))  # fmt: skip


def moe_route(logits: Any, spec: MoeSpec, score_bias: Any = None) -> tuple[Any, Any]:
    """Each token's k expert ids `[T, k]` (int32) and their weights (float32), on the device, as
    moe/ops.py's `route` (the router softcap, score bias, expert groups and routed scale included)."""
    import cupy as cp

    _check_routing(spec)
    n_tok, k = logits.shape[0], spec.num_used
    chosen = cp.empty((n_tok, k), cp.int32)
    weights = cp.empty((n_tok, k), cp.float32)
    launch(_kernel("moe_route"), (max(1, cdiv(n_tok, ROUTE_WARPS)),), (32 * ROUTE_WARPS,),
           (logits, i32(n_tok), *_routing_args(spec, score_bias, logits), chosen, weights))  # fmt: skip
    return chosen, weights


@dataclass(frozen=True)
class PairGroups:
    """The (token, slot) pairs grouped by the slot their product reads (moe_offsets), on the device.

    `offsets` [groups + 1]: group g's pairs are order[offsets[g]:offsets[g + 1]] (pair p = token * k + j);
    `where` [pairs]: pair p's place in that order; `active` [1 + slots]: how many slots have pairs, then
    those slots ascending (what the grouped products' blocks run). `skipping`: the last group holds the
    pairs no slot runs (their outputs stay 0)."""

    offsets: Any
    order: Any
    where: Any
    active: Any
    n_slots: int
    n_pairs: int
    k: int
    skipping: bool

    @property
    def max_tokens(self) -> int:
        """MOE_TMAX for the products: 1 while an expert has about one pair (decode; the lean build keeps
        more warps resident), more as experts get several (each weight row read once per that many)."""
        per_slot = self.n_pairs / max(1, self.n_slots)
        return 1 if per_slot <= 1 else 2 if per_slot <= 4 else 4


def group_pairs(groups: Any, n_slots: int, k: int, skipping: bool) -> PairGroups:
    """`groups` `[T, k]` (int32): the slot of each pair, `n_slots` (one past the last: skipped, when `skipping`).
    One launch up to ONE_BLOCK_PLAN_PAIRS pairs; beyond, the counting and the scatter run over many blocks."""
    import cupy as cp

    pairs = groups.size
    n_groups = n_slots + 1 if skipping else n_slots  # the extra group holds the skipped pairs
    if n_groups > PLAN_MAX_GROUPS:
        raise ValueError(f"{n_slots} expert slots: moe_offsets groups up to {PLAN_MAX_GROUPS - 1}")
    offsets = cp.empty(n_groups + 1, cp.int32)
    active = cp.empty(1 + n_slots, cp.int32)
    order = cp.empty(pairs, cp.int32)
    where = cp.empty(pairs, cp.int32)
    plan = _kernel("moe_offsets")
    if pairs <= ONE_BLOCK_PLAN_PAIRS:
        launch(plan, (1,), (PLAN_THREADS,),
               (groups, i32(pairs), ptr(None), i32(n_groups), i32(n_slots), offsets, ptr(None), active, order,
                where))  # fmt: skip
    else:
        counts = cp.zeros(n_groups, cp.int32)
        cursor = cp.empty(n_groups, cp.int32)
        launch(_kernel("moe_count"), _grid(pairs), (THREADS,), (groups, i32(pairs), counts))
        launch(plan, (1,), (PLAN_THREADS,),
               (groups, i32(pairs), counts, i32(n_groups), i32(n_slots), offsets, cursor, active, ptr(None),
                ptr(None)))  # fmt: skip
        launch(_kernel("moe_scatter"), _grid(pairs), (THREADS,), (groups, i32(pairs), cursor, order, where))
    return PairGroups(offsets, order, where, active, n_slots, pairs, k, skipping)


def route_grouped(logits: Any, spec: MoeSpec, score_bias: Any = None) -> tuple[Any, Any, PairGroups]:
    """moe_route and group_pairs (by expert) in one launch, for up to FUSED_ROUTE_TOKENS tokens."""
    import cupy as cp

    _check_routing(spec)
    n_tok, k, n_exp = logits.shape[0], spec.num_used, spec.num_experts
    if n_tok > FUSED_ROUTE_TOKENS or n_exp > PLAN_MAX_GROUPS:
        raise ValueError(f"route_grouped takes up to {FUSED_ROUTE_TOKENS} tokens, got {n_tok}")
    pairs = n_tok * k
    chosen = cp.empty((n_tok, k), cp.int32)
    weights = cp.empty((n_tok, k), cp.float32)
    offsets, active = cp.empty(n_exp + 1, cp.int32), cp.empty(1 + n_exp, cp.int32)
    order, where = cp.empty(pairs, cp.int32), cp.empty(pairs, cp.int32)
    launch(_kernel("moe_route_grouped"), (1,), (PLAN_THREADS,),
           (logits, i32(n_tok), *_routing_args(spec, score_bias, logits), chosen, weights, offsets, active, order,
            where))  # fmt: skip
    return chosen, weights, PairGroups(offsets, order, where, active, n_exp, pairs, k, False)


def _lane_groups(w: StackedExperts) -> int:
    """Lane groups a warp of the products holds (32 / width: width the largest power of two up to half the
    row's 32-weight units, at most 32; moe.cu's moe_lanes)."""
    return 32 // min(32, 1 << (max(1, w.n_cols // 64).bit_length() - 1))


def _row_tiles(w: StackedExperts) -> int:
    """moe_down_combine's row tiles: a warp's lane groups x ROWS rows each."""
    return cdiv(w.n_rows, _lane_groups(w) * ROWS)


def _product_grid(w: StackedExperts, plan: PairGroups | None) -> tuple[int, int]:
    """(row blocks, experts): a block's warps hold _lane_groups of ROWS rows (of each weight); min(slots, pairs)
    experts (`plan` None: 1)."""
    experts = 1 if plan is None else max(1, min(plan.n_slots, plan.n_pairs))
    return cdiv(w.n_rows, WARPS * _lane_groups(w) * ROWS), experts


def takes_int_x(qtype_name: str) -> bool:
    """Whether the grouped products of this format have an int16-x build (moe.cu's moe_grouped_int_<fmt>)."""
    return qtype_name in INT_X_FORMATS


def quantize_rows(x: Any) -> tuple[Any, Any]:
    """`x [rows, cols]` (float32) as the int16-x products read it (moe_xq): codes `[rows, cols]` (uint16) and
    each 16-column group's (scale, sum) `[rows, cols / 16, 2]` (float32)."""
    import cupy as cp

    rows, cols = x.shape
    codes = cp.empty((rows, cols), cp.uint16)
    ds = cp.empty((rows, cols // 16, 2), cp.float32)
    launch(_kernel("moe_xq"), _grid(rows * cols // 16), (THREADS,), (x, i32(rows), i32(cols), codes, ds))
    return codes, ds


def _inputs(w: StackedExperts, x: Any, int_x: bool) -> tuple[str, tuple]:
    """The products' kernel name infix and input arguments: float32 rows, or (int_x and a format with integer codes)
    the rows quantized by moe_xq."""
    if int_x and takes_int_x(w.qtype_name):
        return "_int", quantize_rows(x)
    return "", (x,)


def grouped_product(
    w: StackedExperts, inputs: Any, plan: PairGroups, per_pair: bool, act: int = -1, int_x: bool = False
) -> Any:
    """`[pairs, w.n_rows]` in grouped order: each pair's row of `inputs` (its token's, or with `per_pair`
    its own in grouped order) times its expert's `w` (+ bias); `act` 2: relu of it squared. `int_x`
    (KernelOptions.moe_int_x): over the inputs quantized to int16 where the format has integer codes."""
    import cupy as cp

    y = (cp.zeros if plan.skipping else cp.empty)((plan.n_pairs, w.n_rows), cp.float32)  # skipped rows stay 0
    infix, x_args = _inputs(w, inputs, int_x)
    kernel = _kernel(f"moe_grouped{infix}_{w.qtype_name.lower()}", w.qtype_name, plan.max_tokens)
    launch(kernel, _product_grid(w, plan), (32 * WARPS,),
           (w.data, i64(w.expert_stride), i64(w.row_bytes), i32(w.n_rows), i32(w.n_cols), *x_args, i32(per_pair),
            plan.order, plan.offsets, plan.active, i32(plan.k), ptr(w.bias), i32(act), y))  # fmt: skip
    return y


def gated_product(
    x: Any, plan: PairGroups, spec: MoeSpec, gate: StackedExperts | None, up: StackedExperts, int_x: bool = False
) -> Any:
    """`[pairs, ffn]` in grouped order: act(gate x) * up x per pair (ungated: relu(up x)^2), one launch
    where gate and up share a format (each x load serves both rows), else two products and moe_gated.
    `int_x`: as grouped_product's."""
    import cupy as cp

    kind = ACTIVATION_KINDS[spec.activation]
    if gate is None:
        return grouped_product(up, x, plan, False, act=kind, int_x=int_x)
    if gate.qtype_name != up.qtype_name or gate.row_bytes != up.row_bytes or gate.n_rows != up.n_rows:
        g, u = grouped_product(gate, x, plan, False, int_x=int_x), grouped_product(up, x, plan, False, int_x=int_x)
        act = cp.empty_like(u)
        launch(_kernel("moe_gated"), _grid(u.size), (THREADS,),
               (g, u, i64(u.size), i32(kind), f32(spec.swiglu_limit), f32(spec.swiglu_alpha), act))  # fmt: skip
        return act
    y = (cp.zeros if plan.skipping else cp.empty)((plan.n_pairs, up.n_rows), cp.float32)
    infix, x_args = _inputs(up, x, int_x)
    kernel = _kernel(f"moe_grouped_gated{infix}_{up.qtype_name.lower()}", up.qtype_name, plan.max_tokens)
    launch(kernel, _product_grid(up, plan), (32 * WARPS,),
           (gate.data, up.data, i64(up.expert_stride), i64(up.row_bytes), i32(up.n_rows), i32(up.n_cols), *x_args,
            plan.order, plan.offsets, plan.active, i32(plan.k), ptr(gate.bias), ptr(up.bias), i32(kind),
            f32(spec.swiglu_limit), f32(spec.swiglu_alpha), y))  # fmt: skip
    return y


def _tensor_core_product(w: StackedExperts, inputs: Any, plan: PairGroups, per_pair: bool) -> Any:
    """grouped_product's output, from moe_mma.cu's grouped GEMM (prefill: many pairs an expert)."""
    import cupy as cp

    y = (cp.zeros if plan.skipping else cp.empty)((plan.n_pairs, w.n_rows), cp.float32)  # skipped rows stay 0
    return moe_mma.grouped_mma(w, inputs, per_pair, plan.order, plan.offsets, plan.k, plan.n_slots, y)


def _gated_on_tensor_cores(
    x: Any, plan: PairGroups, spec: MoeSpec, gate: StackedExperts | None, up: StackedExperts
) -> Any:
    """gated_product's output with the gate and up products on the tensor cores, then moe_gated."""
    import cupy as cp

    u = _tensor_core_product(up, x, plan, False)
    g = u if gate is None else _tensor_core_product(gate, x, plan, False)  # ungated: relu2's kind reads `up` alone
    act = cp.empty_like(u)
    launch(_kernel("moe_gated"), _grid(u.size), (THREADS,),
           (g, u, i64(u.size), i32(ACTIVATION_KINDS[spec.activation]), f32(spec.swiglu_limit),
            f32(spec.swiglu_alpha), act))  # fmt: skip
    return act


def _check_activation(spec: MoeSpec, gate: StackedExperts | None) -> None:
    """A ValueError unless the experts' activation has a kernel and a gate product exactly when it needs one."""
    if spec.activation not in ACTIVATION_KINDS or (gate is None) != (spec.activation == "relu2"):
        raise ValueError(f"activation {spec.activation!r} with{'out' if gate is None else ''} a gate product")


def moe_experts(
    x: Any,
    chosen: Any,
    weights: Any,
    spec: MoeSpec,
    gate: StackedExperts | None,
    up: StackedExperts,
    down: StackedExperts,
    groups: Any = None,
    plan: PairGroups | None = None,
    expert_scale: Any = None,
    int_x: bool = False,
) -> Any:
    """The routed pairs through the grouped gate/up product with its activation (or, with `gate` None,
    the ungated activation of the up product), the grouped down product and the combine.

    `groups` `[T, k]` (int32): the stacked slot each pair's product reads, by default its expert.
    A pair whose group is `up.num_experts` (one past the last slot) is skipped: its output is 0,
    so one call can run only the experts that are in slots (backend/cuda/experts.py streams the
    rest). The combine adds a token's pairs in expert-id order (`chosen`) either way. `plan`: the
    pairs already grouped (route_grouped), no `groups` then. `expert_scale` (float32 `[E]`): the
    weights times their expert's factor in the combine (as route_scaled scales them). `int_x`: the products
    off the tensor cores over int16 x (grouped_product)."""
    import cupy as cp

    _check_activation(spec, gate)
    if down.n_rows % 4:
        raise ValueError(f"{down.n_rows} output columns: moe_combine takes a multiple of 4 (float4 rows)")
    n_tok, k = x.shape[0], spec.num_used
    if plan is None:
        plan = group_pairs(chosen if groups is None else groups, up.num_experts, k, groups is not None)
    # many pairs an expert (by the model's experts, so streamed slots choose as the resident layer): tensor cores
    if moe_mma.serves(up.qtype_name, n_tok, k, spec.num_experts, up.n_cols):
        act = _gated_on_tensor_cores(x, plan, spec, gate, up)
    else:
        act = gated_product(x, plan, spec, gate, up, int_x)
    if moe_mma.serves(down.qtype_name, n_tok, k, spec.num_experts, down.n_cols):
        h = _tensor_core_product(down, act, plan, True)
    else:
        h = grouped_product(down, act, plan, True, int_x=int_x)
    out = cp.empty((n_tok, down.n_rows), cp.float32)
    launch(_kernel("moe_combine"), (n_tok,), (THREADS,),
           (h, chosen, weights, ptr(expert_scale), plan.where, i32(k), i32(down.n_rows), out))  # fmt: skip
    return out


def few_tokens_serve(n_tok: int, spec: MoeSpec, gate: StackedExperts | None, up: StackedExperts) -> bool:
    """Whether moe_forward takes `n_tok` tokens through moe_few_tokens: up to FUSED_DECODE_MAX_TOKENS, every
    expert in its slot (no streaming) and, gated, gate and up in one format (the fused per-pair product)."""
    same_format = gate is None or (
        gate.qtype_name == up.qtype_name and gate.row_bytes == up.row_bytes and gate.n_rows == up.n_rows
    )
    return 1 <= n_tok <= FUSED_DECODE_MAX_TOKENS and up.num_experts == spec.num_experts and same_format


def pair_product(x: Any, chosen: Any, spec: MoeSpec, gate: StackedExperts | None, up: StackedExperts) -> Any:
    """`[T k, ffn]` in pair order (pair p = token * k + slot): act(gate x) * up x of each token's row
    against its chosen expert (ungated: relu(up x)^2), one block row a pair (moe_pair[_gated]_<fmt>)."""
    import cupy as cp

    n_pairs, k, kind = chosen.size, spec.num_used, ACTIVATION_KINDS[spec.activation]
    y = cp.empty((n_pairs, up.n_rows), cp.float32)
    grid = (_product_grid(up, None)[0], n_pairs)
    common = (i64(up.expert_stride), i64(up.row_bytes), i32(up.n_rows), i32(up.n_cols), x, chosen, i32(k))
    if gate is None:
        launch(_kernel(f"moe_pair_{up.qtype_name.lower()}", up.qtype_name, 1), grid, (32 * WARPS,),
               (up.data, *common, ptr(up.bias), i32(kind), y))  # fmt: skip
    else:
        launch(_kernel(f"moe_pair_gated_{up.qtype_name.lower()}", up.qtype_name, 1), grid, (32 * WARPS,),
               (gate.data, up.data, *common, ptr(gate.bias), ptr(up.bias), i32(kind), f32(spec.swiglu_limit),
                f32(spec.swiglu_alpha), y))  # fmt: skip
    return y


def down_combine(
    act: Any, chosen: Any, weights: Any, down: StackedExperts, expert_scale: Any = None, shared: SharedJoin | None = None
) -> Any:  # fmt: skip
    """`[T, hidden]`: per token, the sum over its k pairs (in expert-id order, as moe_combine) of the weight
    (times expert_scale[e] where given) times the pair's `act` row (pair order) through its expert's `down`
    (+ bias), then `shared`'s row gated where given. One launch (moe_down_combine_<fmt>): blocks of k warps
    over (row tiles, tokens)."""
    import cupy as cp

    n_tok, k = chosen.shape
    out = cp.empty((n_tok, down.n_rows), cp.float32)
    rows, logit, stride = (NULL, NULL, 0) if shared is None else shared.args(n_tok, down.n_rows)
    launch(_kernel(f"moe_down_combine_{down.qtype_name.lower()}", down.qtype_name, 1),
           (_row_tiles(down), n_tok), (32 * k,),
           (down.data, i64(down.expert_stride), i64(down.row_bytes), i32(down.n_rows), i32(down.n_cols), act, chosen,
            weights, ptr(expert_scale), i32(k), ptr(down.bias), rows, logit, i64(stride), out))  # fmt: skip
    return out


def moe_few_tokens(
    x: Any, chosen: Any, weights: Any, spec: MoeSpec, gate: StackedExperts | None, up: StackedExperts,
    down: StackedExperts, expert_scale: Any = None, shared: SharedJoin | None = None,
) -> Any:  # fmt: skip
    """moe_experts' output for a few tokens (few_tokens_serve) with no grouping: the products per pair, the
    down product and the combine (and `shared`, gated) in one launch. Two launches after the router."""
    _check_activation(spec, gate)
    if not 1 <= spec.num_used <= MAX_USED or chosen.shape != (x.shape[0], spec.num_used):
        raise ValueError(f"chosen {chosen.shape} for {x.shape[0]} tokens of {spec.num_used} experts each "
                         f"(the kernels take 1 to {MAX_USED})")  # fmt: skip
    act = pair_product(x, chosen, spec, gate, up)
    return down_combine(act, chosen, weights, down, expert_scale, shared)
