"""Mixture-of-experts feed-forward: a router picks k experts per token, their outputs are summed.

Written over backend ops so every backend runs it: the router is a `linear`, each expert a
gated product and a `linear`. Tokens are grouped by expert (one stable sort of the k choices of
every token), so each expert that any token picked runs once, on all of its tokens together;
an expert nobody picked costs nothing. A token's contributions are added in expert order,
whatever else is in the batch, as transformers adds them.

Checkpoints hold an expert tensor either stacked (GGUF's `ffn_gate_exps.weight [E, ff, hidden]`,
split here into E zero-copy row views) or one per expert (`ffn_gate_exps.{e}.weight`, as Hugging
Face folders list them).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.engine.backend.base import Backend
from app.engine.layers.linear import Linear, stack_rows
from app.engine.layers.mlp import UpDownMLP
from app.engine.loader.names import CheckpointError
from app.engine.moe.ops import expert_forward, route, sum_over_experts
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.specs import UNGATED_ACTIVATIONS, MoeSpec


def expert_tensors(
    tensors: dict[str, QuantizedTensor], name: str, count: int
) -> list[QuantizedTensor] | None:
    """The `count` experts' slices of `name` ("blk.0.ffn_up_exps.weight"), or None if absent."""
    stacked = tensors.get(name)
    if stacked is None:
        base, kind = name.rsplit(".", 1)
        parts = [tensors.get(f"{base}.{e}.{kind}") for e in range(count)]
        if all(p is None for p in parts):
            return None
        if any(p is None for p in parts):
            missing = next(e for e, p in enumerate(parts) if p is None)
            raise CheckpointError(f"tensor {base}.{missing}.{kind} is missing ({count} experts)")
        return parts  # type: ignore[return-value]
    if stacked.shape[0] != count:
        raise CheckpointError(f"tensor {name!r} has shape {stacked.shape}: expected {count} experts first")
    rows = math.prod(stacked.shape[1:-1]) if len(stacked.shape) > 2 else 1
    shape = stacked.shape[1:] if len(stacked.shape) > 1 else (1,)
    return [
        QuantizedTensor(f"{name}[{e}]", stacked.qtype, shape, stacked.data[e * rows : (e + 1) * rows])
        for e in range(count)
    ]


# The routings a backend's fused expert kernels (`load_experts` / `moe`) compute on the device.
DEVICE_ROUTINGS = ("softmax_topk", "topk_softmax", "sigmoid_grouped")


class MoE:
    """On a backend with `load_experts` (CUDA) whose kernels read the experts' format, the whole
    layer after the router is one `backend.moe` call on the device; elsewhere it is the loop below
    over backend ops, which reads the expert counts back to the host (the oracle the kernels are
    tested against)."""

    def __init__(self, backend: Backend, tensors: dict[str, QuantizedTensor], prefix: str, spec: MoeSpec) -> None:
        self.backend, self.spec = backend, spec
        self.shared = SharedExpert(backend, tensors, prefix, spec) if spec.shared_intermediate_size else None
        router, router_bias = tensors[f"{prefix}.ffn_gate_inp.weight"], tensors.get(f"{prefix}.ffn_gate_inp.bias")
        self.router: Linear | RouterAndGate = Linear(backend, router, router_bias)
        if self.shared is not None and self.shared.gate_tensor is not None and router_bias is None \
                and getattr(backend, "moe_joins_shared", False):  # fmt: skip
            self.router = RouterAndGate(backend, router, self.shared.gate_tensor)
        self.latent_down = self.latent_up = None
        if spec.latent_size is not None:  # the routed experts' own smaller space (Nemotron 3 Super)
            self.latent_down = Linear(backend, _need(tensors, f"{prefix}.ffn_latent_down.weight"))
            self.latent_up = Linear(backend, _need(tensors, f"{prefix}.ffn_latent_up.weight"))
        self.score_bias = None  # sigmoid_grouped routing's per-expert bias on the choice (`exp_probs_b`)
        if f"{prefix}.exp_probs_b.bias" in tensors:
            bias = tensors[f"{prefix}.exp_probs_b.bias"].dequantize().astype(np.float32).reshape(-1)
            self.score_bias = backend.from_host(bias)
        n = spec.num_experts

        def experts(part: str) -> tuple[list[QuantizedTensor], list[QuantizedTensor | None]]:
            weights = expert_tensors(tensors, f"{prefix}.ffn_{part}_exps.weight", n)
            if weights is None:
                raise CheckpointError(f"tensor {prefix}.ffn_{part}_exps.weight is missing")
            biases = expert_tensors(tensors, f"{prefix}.ffn_{part}_exps.bias", n) or [None] * n
            return weights, biases  # type: ignore[return-value]

        (up_w, up_b), (down_w, down_b) = experts("up"), experts("down")
        # A learned scale per expert's output (Gemma 4; llama.cpp's `ffn_down_exps.scale`).
        scale = tensors.get(f"{prefix}.ffn_down_exps.scale")
        self.expert_scale = None if scale is None else backend.from_host(scale.dequantize().reshape(-1))
        ungated = spec.activation in UNGATED_ACTIVATIONS  # down(act(up x)): up alone, no gate
        if ungated and any(b is not None for b in up_b):
            raise CheckpointError(f"tensor {prefix}.ffn_up_exps.bias: ungated experts with biases are not supported")
        gate_w, gate_b = ([], []) if ungated else experts("gate")
        # the grouped kernels take only the routings they compute on the device (a latent space is a product on
        # each side of them): a backend's `moe_routing(spec)` says which (its `moe` then takes the per-expert
        # scale, the score bias and the router softcap too), else DEVICE_ROUTINGS without a per-expert scale
        # or a router softcap
        says = getattr(backend, "moe_routing", None)
        if says is not None:
            device_routing = says(spec)
        else:
            device_routing = spec.routing in DEVICE_ROUTINGS and scale is None and not spec.router_softcap
        load = getattr(backend, "load_experts", None) if device_routing else None
        weights, biases = [up_w, down_w], [up_b, down_b]
        if not ungated:
            weights, biases = [gate_w, *weights], [gate_b, *biases]
        self.grouped = None if load is None else load(spec, weights, biases)
        if self.grouped is not None:
            return
        self.down = [Linear(backend, w, b) for w, b in zip(down_w, down_b, strict=True)]
        if ungated:
            self.gate_up = [backend.load_weight(w) for w in up_w]
            return
        self.gate_up = [
            backend.fuse_linear(
                [backend.load_weight(g), backend.load_weight(u)],
                [None if b is None else backend.load_weight(b) for b in (gb, ub)],
            )
            for g, u, gb, ub in zip(gate_w, up_w, gate_b, up_b, strict=True)
        ]

    @property
    def syncs_host(self) -> bool:
        """Whether a forward reads the router's choices back to the host (the per-expert loop, or
        experts streamed from host RAM); on a GPU, no CUDA graph can hold such a step."""
        return self.grouped is None or getattr(self.grouped, "syncs_host", False)

    def __call__(self, x: Any, router_input: Any = None) -> Any:
        """`[T, hidden]` normalised hidden states -> the experts' weighted sum, `[T, hidden]`; the router
        reads `router_input` where the family routes on something else than the experts' input (Gemma 4)."""
        if router_input is None and isinstance(self.router, RouterAndGate):  # one product: router and shared gate
            assert self.shared is not None  # RouterAndGate carries the shared expert's gate
            logits, gate_logit = self.router.with_gate(x)
            shared = (self.shared.ungated(x), gate_logit)
            if self.grouped is not None and self.latent_up is None:  # the backend adds it in its combine
                return self._routed(x, logits, shared=shared)
            return self._routed(x, logits) + self.backend.output_gate(*shared, "sigmoid")
        routed = self._routed(x, self.router(x if router_input is None else router_input))
        return routed if self.shared is None else routed + self.shared(x)

    def _routed(self, x: Any, logits: Any, shared: tuple[Any, Any] | None = None) -> Any:
        if self.grouped is not None:
            inputs = x if self.latent_down is None else self.latent_down(x)
            extras = {"expert_scale": self.expert_scale, "score_bias": self.score_bias, "shared": shared}
            given = {name: value for name, value in extras.items() if value is not None}
            routed = self.backend.moe(inputs, logits, self.spec, self.grouped, **given)
            return routed if self.latent_up is None else self.latent_up(routed)
        weights, chosen = route(self.backend.xp, logits, self.spec, self.score_bias)
        if self.expert_scale is not None:
            weights = weights * self.expert_scale[chosen]

        def run(expert: int, rows: Any) -> Any:
            down = self.down[expert]
            return expert_forward(self.backend, self.spec, self.gate_up[expert], down.weight, down.bias, rows)

        if self.latent_down is None:
            return sum_over_experts(self.backend, x, weights, chosen, self.spec, run)
        summed = sum_over_experts(self.backend, self.latent_down(x), weights, chosen, self.spec, run)
        return self.latent_up(summed)


class RouterAndGate:
    """The router's rows and the shared expert's gate row in one product (Qwen3.5-MoE, Qwen3-Next on a backend
    that joins the shared expert to the routed sum): one launch for both a decode layer. Called like the router,
    it gives the router's logits, a view of the first E columns (rows of E + 1: the MoE kernels read the stride)."""

    def __init__(self, backend: Backend, router: QuantizedTensor, gate: QuantizedTensor) -> None:
        self.num_experts = router.shape[0]
        self.both = Linear(backend, stack_rows(router, gate, f"{router.name}+{gate.name}"))

    def with_gate(self, x: Any) -> tuple[Any, Any]:
        """(router logits `[T, E]`, shared gate logits `[T, 1]`), views of one product."""
        out = self.both(x)
        return out[:, : self.num_experts], out[:, self.num_experts :]

    def __call__(self, x: Any) -> Any:
        return self.with_gate(x)[0]


class SharedExpert:
    """The expert every token goes through beside the routed ones (`ffn_{gate,up,down}_shexp`), its
    output scaled per token by `sigmoid(x @ ffn_gate_inp_shexp)` when `spec.shared_gate` (Qwen3-Next,
    Qwen3.5-MoE)."""

    def __init__(self, backend: Any, tensors: dict[str, QuantizedTensor], prefix: str, spec: MoeSpec) -> None:
        def need(name: str) -> QuantizedTensor:
            tensor = tensors.get(f"{prefix}.{name}.weight")
            if tensor is None:
                raise CheckpointError(f"tensor {prefix}.{name}.weight (the shared expert) is missing")
            return tensor

        self.backend, self.activation = backend, spec.activation
        self.plain = None
        if spec.activation in UNGATED_ACTIVATIONS:  # Nemotron-H: down(relu(up x)^2)
            self.plain = UpDownMLP(backend, need("ffn_up_shexp"), need("ffn_down_shexp"), spec.activation)
        else:
            self.gate_up = backend.fuse_linear(
                [backend.load_weight(need("ffn_gate_shexp")), backend.load_weight(need("ffn_up_shexp"))],
                [None, None],
            )
            self.down = Linear(backend, need("ffn_down_shexp"))
        self.gate = self.gate_tensor = None
        if spec.shared_gate:
            gate = need("ffn_gate_inp_shexp")  # [hidden] in GGUF, [1, hidden] in Hugging Face files
            self.gate_tensor = QuantizedTensor(gate.name, gate.qtype, (1, gate.shape[-1]), gate.data)
            self.gate = Linear(backend, self.gate_tensor)

    def ungated(self, x: Any) -> Any:
        """The expert's output before its gate (a backend that joins it to the routed sum gates it there)."""
        if self.plain is not None:
            return self.plain(x)
        return self.down(self.backend.gated_linear(x, self.gate_up, self.activation))

    def __call__(self, x: Any) -> Any:
        out = self.ungated(x)
        if self.gate is None:
            return out
        # The gate's one column scales the whole row: the attention output gate's op with one "head",
        # one launch where the expression out * (1 / (1 + exp(-logit))) took five (~12 us a decode layer).
        return self.backend.output_gate(out, self.gate(x), "sigmoid")


def _need(tensors: dict[str, QuantizedTensor], name: str) -> QuantizedTensor:
    if name not in tensors:
        raise CheckpointError(f"tensor {name} is missing")
    return tensors[name]
