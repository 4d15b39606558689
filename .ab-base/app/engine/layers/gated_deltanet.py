"""Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next): a recurrent token mixer with a fixed-size
state per sequence.

Per token: one projection gives the mixed q|k|v (conv input), the output gate z, and per value head
the update strength b and the decay input a; a short depthwise causal conv (SiLU) runs over q|k|v;
then the gated delta rule (backend/recurrent_reference.py) with `beta = sigmoid(b)` and log-decay
`g = -exp(A_log) * softplus(a + dt_bias)`; its output is RMS-normalised per value head, times
`silu(z)`, and projected back to the hidden size.

Contract with the decoder (models/decoder.py) and the runner:
- `GatedDeltaNet(backend, tensors, prefix, spec: GatedDeltaNetSpec, eps)` builds from the layer's
  tensors under `prefix` ("blk.3") in llama.cpp's qwen35 GGUF names: `attn_qkv`, `attn_gate` (z),
  `ssm_beta`, `ssm_alpha`, `ssm_conv1d [conv_dim, K]`, `ssm_dt.bias`, `ssm_a` (= -exp(A_log)),
  `ssm_norm`, `ssm_out`. Families whose files say it otherwise (Qwen3-Next's fused `ssm_ba`, Hugging
  Face names) rename and split in their `adapt_*_tensors`.
- `__call__(x [T, hidden], meta, state) -> [T, hidden]`, where `state = (conv_state, recurrent_state)`
  are the layer's arrays `[num_slots, *shape]` for `spec.state_shapes()` (float32). Sequence i of the
  batch owns flat rows `meta.query_start_loc[i]:[i+1]`, its state row is `meta.state_slots[i]`, and it
  continues that state when `meta.has_initial_state[i]`, else starts from zeros. The layer updates the
  rows in place so the next chunk / decode step continues from them.

The conv, the delta rule (with its gates) and the gated output norm are backend ops: the numpy and
numba backends run recurrent_reference.py's math (the oracle for kernels), CUDA one launch per op, and at
decode one for all three (`gated_delta_net_mixer`).
"""

from __future__ import annotations

from typing import Any

from app.engine.layers.linear import Linear, stack_rows
from app.engine.loader.names import CheckpointError
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.specs import GatedDeltaNetSpec

_IN_PROJECTIONS = ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha")


class GatedDeltaNet:
    def __init__(
        self,
        backend: Any,
        tensors: dict[str, QuantizedTensor],
        prefix: str,
        spec: GatedDeltaNetSpec,
        eps: float,
    ) -> None:
        self.backend, self.spec, self.eps = backend, spec, eps
        value_dim = spec.num_v_heads * spec.head_v_dim
        if spec.num_v_heads % spec.num_k_heads:
            raise CheckpointError(
                f"{prefix}: {spec.num_v_heads} value heads do not divide into {spec.num_k_heads} key heads"
            )

        def tensor(name: str, shape: tuple[int, ...]) -> QuantizedTensor:
            t = tensors.get(f"{prefix}.{name}")
            if t is None:
                raise CheckpointError(f"tensor '{prefix}.{name}' is missing (a Gated DeltaNet layer)")
            if t.shape != shape:
                raise CheckpointError(
                    f"tensor '{prefix}.{name}' has shape {t.shape}; the config makes it {shape}"
                )
            return t

        out = tensors.get(f"{prefix}.ssm_out.weight")
        if out is None:
            raise CheckpointError(f"tensor '{prefix}.ssm_out.weight' is missing (a Gated DeltaNet layer)")
        hidden = out.shape[0]
        rows = (spec.conv_dim, value_dim, spec.num_v_heads, spec.num_v_heads)
        qkv, z, beta, alpha = (tensor(f"{n}.weight", (r, hidden)) for n, r in zip(_IN_PROJECTIONS, rows, strict=True))
        # b and a as one matrix: one small product (often F32) rather than two, beside the big ones
        parts = (qkv, z, stack_rows(beta, alpha, f"{prefix}.ssm_beta_alpha.weight"))
        self.in_proj = backend.fuse_linear([backend.load_weight(p) for p in parts], [None] * len(parts))
        self.splits = (spec.conv_dim, spec.conv_dim + value_dim)  # conv input | z | b, a
        self.conv_weight = _dense(backend, tensor("ssm_conv1d.weight", (spec.conv_dim, spec.conv_kernel)))
        self.dt_bias = _dense(backend, tensor("ssm_dt.bias", (spec.num_v_heads,)))
        self.neg_a = _dense(backend, tensor("ssm_a", (spec.num_v_heads,)))  # -exp(A_log)
        self.norm_weight = backend.load_weight(tensor("ssm_norm.weight", (spec.head_v_dim,)))
        self.out = Linear(backend, tensor("ssm_out.weight", (hidden, value_dim)))

    def __call__(self, x: Any, meta: Any, state: tuple[Any, Any]) -> Any:
        s, b = self.spec, self.backend
        conv_state, recurrent_state = state
        n = x.shape[0]
        proj = b.linear(x, self.in_proj).astype(b.xp.float32, copy=False)
        i_z, i_b = self.splits
        gated = b.gated_delta_net_mixer(  # conv, delta rule, then norm(the rule's output) * silu(z)
            proj[:, :i_z], self.conv_weight, conv_state, proj[:, i_b:], self.neg_a, self.dt_bias, recurrent_state,
            meta, s, proj[:, i_z:i_b], self.norm_weight, self.eps,
        )  # fmt: skip
        flat = b.xp.ascontiguousarray(gated.reshape(n, s.num_v_heads * s.head_v_dim))
        return self.out(flat.astype(x.dtype, copy=False))


def _dense(backend: Any, tensor: QuantizedTensor) -> Any:
    """A small parameter as a float32 device array."""
    return backend.from_host(tensor.dequantize().astype("float32"))
