"""The experts' arithmetic over backend ops: routing, one expert on its tokens, and the weighted sum in
expert order. Shared by the layer's own loop (layers/moe.py) and the CPU backend's streamed experts, so
both compute the same values in the same order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from app.engine.specs import UNGATED_ACTIVATIONS, MoeSpec


def sum_over_experts(
    backend: Any, x: Any, weights: Any, chosen: Any, spec: MoeSpec, run: Callable[[int, Any], Any]
) -> Any:
    """Each token's experts' outputs times their weights, summed: every picked expert runs once, in
    ascending id order, on all of its tokens' rows (`run(expert, rows)`), and a token's contributions
    are added in that order, whatever else is in the batch."""
    xp = backend.xp
    flat = chosen.reshape(-1)
    order = xp.argsort(flat, kind="stable")  # the (token, slot) pairs grouped by expert
    counts = backend.to_host(xp.bincount(flat, minlength=spec.num_experts))
    flat_weights = weights.reshape(-1)
    out = xp.zeros_like(x)
    start = 0
    for expert, count in enumerate(counts.tolist()):
        if not count:
            continue
        picks = order[start : start + count]
        start += count
        rows = picks // spec.num_used  # distinct: a token picks an expert at most once
        out[rows] += run(expert, x[rows]) * flat_weights[picks][:, None]
    return out


def expert_forward(backend: Any, spec: MoeSpec, gate_up: Any, down: Any, down_bias: Any, x: Any) -> Any:
    """One expert on its tokens' rows: the gated unit over the fused gate and up products, then down."""
    if spec.activation in UNGATED_ACTIVATIONS:  # `gate_up` is the up projection alone
        act = ungated_activation(backend.xp, backend.linear(x, gate_up), spec.activation)
    elif spec.activation != "swiglu_oai":
        act = backend.gated_linear(x, gate_up, spec.activation)
    else:
        act = swiglu_oai(backend.xp, backend.linear(x, gate_up), spec.swiglu_limit, spec.swiglu_alpha)
    return backend.linear(act, down, down_bias)


def route(xp: Any, logits: Any, spec: MoeSpec, score_bias: Any = None) -> tuple[Any, Any]:
    """Each token's k expert ids (best first) and their weights, as the family's router computes them
    (`score_bias`: sigmoid_grouped's per-expert bias on the choice, none if None)."""
    k = spec.num_used
    if spec.router_softcap:
        cap = logits.dtype.type(spec.router_softcap)
        logits = xp.tanh(logits / cap) * cap
    if spec.routing == "sigmoid_grouped":
        return _sigmoid_grouped(xp, logits, spec, score_bias)
    chosen = xp.argsort(-logits, axis=-1, kind="stable")[:, :k]
    if spec.routing == "softmax_topk":
        probs = _softmax(xp, logits)
        top = xp.take_along_axis(probs, chosen, axis=-1)
        if spec.normalize:
            top = top / top.sum(axis=-1, keepdims=True)
        return top, chosen
    if spec.routing == "topk_softmax":
        return _softmax(xp, xp.take_along_axis(logits, chosen, axis=-1)), chosen
    raise ValueError(
        f"unknown expert routing {spec.routing!r}; expected softmax_topk, topk_softmax or sigmoid_grouped"
    )


def _sigmoid_grouped(xp: Any, logits: Any, spec: MoeSpec, score_bias: Any) -> tuple[Any, Any]:
    """Nemotron-H's router (transformers' NemotronHTopkRouter): sigmoid scores; the experts are chosen
    on scores + bias, only within the `topk_groups` groups whose two best biased scores sum highest;
    their weights are the unbiased scores, renormalised (when `normalize`), times `routed_scale`."""
    scores = 1.0 / (1.0 + xp.exp(-logits.astype(xp.float32, copy=False)))
    choice = scores if score_bias is None else scores + score_bias
    if spec.num_groups > 1:
        tokens, per_group = choice.shape[0], spec.num_experts // spec.num_groups
        grouped = choice.reshape(tokens, spec.num_groups, per_group)
        best_two = -xp.sort(-grouped, axis=-1)[..., :2]
        order = xp.argsort(-best_two.sum(axis=-1), axis=-1, kind="stable")
        allowed = xp.argsort(order, axis=-1) < spec.topk_groups  # each group's rank among the token's groups
        choice = xp.where(xp.repeat(allowed, per_group, axis=1), choice, -xp.inf)
    chosen = xp.argsort(-choice, axis=-1, kind="stable")[:, : spec.num_used]
    weights = xp.take_along_axis(scores, chosen, axis=-1)
    if spec.normalize:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + xp.float32(1e-20))
    return weights * xp.float32(spec.routed_scale), chosen


def _softmax(xp: Any, x: Any) -> Any:
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def swiglu_oai(xp: Any, gate_up: Any, limit: float, alpha: float) -> Any:
    """GPT-OSS's gated unit on `[T, 2 ff]` (gate columns, then up): `(clamp(up) + 1) * g * sigmoid(alpha g)`
    with `g = min(gate, limit)` and up clamped to +-limit."""
    half = gate_up.shape[-1] // 2
    one = gate_up.dtype.type(1.0)
    gate = xp.minimum(gate_up[:, :half], gate_up.dtype.type(limit))
    up = xp.clip(gate_up[:, half:], -limit, limit)
    with np.errstate(over="ignore"):  # numpy: exp overflows to inf for a very negative gate, and g / inf is the limit
        glu = gate / (one + xp.exp(-gate * gate_up.dtype.type(alpha)))
    return (up + one) * glu


def ungated_activation(xp: Any, x: Any, kind: str) -> Any:
    """`relu(x)^2` for "relu2" (transformers' ReLUSquaredActivation, llama.cpp's RELU_SQR)."""
    if kind == "relu2":
        r = xp.maximum(x, x.dtype.type(0.0))
        return r * r
    raise ValueError(f"unknown ungated activation {kind!r}; expected one of {UNGATED_ACTIVATIONS}")
