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

Written over `backend.xp` and backend ops, so any backend runs it (unfused, as the oracle for kernels).
"""

from __future__ import annotations

from typing import Any

from app.engine.backend.recurrent_reference import causal_conv1d, gated_delta_rule
from app.engine.layers.linear import Linear
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
        key_dim = spec.num_k_heads * spec.head_k_dim
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
        parts = [tensor(f"{n}.weight", (r, hidden)) for n, r in zip(_IN_PROJECTIONS, rows, strict=True)]
        self.in_proj = backend.fuse_linear([backend.load_weight(p) for p in parts], [None] * len(parts))
        self.splits = (spec.conv_dim, spec.conv_dim + value_dim, spec.conv_dim + value_dim + spec.num_v_heads)
        self.key_dim = key_dim
        self.conv_weight = _dense(backend, tensor("ssm_conv1d.weight", (spec.conv_dim, spec.conv_kernel)))
        self.dt_bias = _dense(backend, tensor("ssm_dt.bias", (spec.num_v_heads,)))
        self.neg_a = _dense(backend, tensor("ssm_a", (spec.num_v_heads,)))  # -exp(A_log)
        self.norm_weight = backend.load_weight(tensor("ssm_norm.weight", (spec.head_v_dim,)))
        self.out = Linear(backend, tensor("ssm_out.weight", (hidden, value_dim)))

    def __call__(self, x: Any, meta: Any, state: tuple[Any, Any]) -> Any:
        s, b, xp = self.spec, self.backend, self.backend.xp
        f32 = xp.float32
        conv_state, recurrent_state = state
        n = x.shape[0]
        proj = b.linear(x, self.in_proj).astype(f32, copy=False)
        i_z, i_b, i_a = self.splits
        mixed = causal_conv1d(xp, proj[:, :i_z], self.conv_weight, None, conv_state, meta, silu=True)
        q = mixed[:, : self.key_dim].reshape(n, s.num_k_heads, s.head_k_dim)
        k = mixed[:, self.key_dim : 2 * self.key_dim].reshape(n, s.num_k_heads, s.head_k_dim)
        v = mixed[:, 2 * self.key_dim :].reshape(n, s.num_v_heads, s.head_v_dim)
        beta = _sigmoid(xp, proj[:, i_b:i_a])
        g = self.neg_a * _softplus(xp, proj[:, i_a:] + self.dt_bias)
        core = gated_delta_rule(xp, q, k, v, g, beta, recurrent_state, meta, s.tiled_v_heads)
        z = proj[:, i_z:i_b].reshape(n * s.num_v_heads, s.head_v_dim)
        normed = b.rms_norm(core.reshape(n * s.num_v_heads, s.head_v_dim), self.norm_weight, self.eps)
        gated = normed * (z * _sigmoid(xp, z))  # per value head: norm(core) * silu(z)
        return self.out(xp.ascontiguousarray(gated.reshape(n, s.num_v_heads * s.head_v_dim)).astype(x.dtype))


def _dense(backend: Any, tensor: QuantizedTensor) -> Any:
    """A small parameter as a float32 device array."""
    return backend.from_host(tensor.dequantize().astype("float32"))


def _sigmoid(xp: Any, x: Any) -> Any:
    return x.dtype.type(1.0) / (x.dtype.type(1.0) + xp.exp(-x))


def _softplus(xp: Any, x: Any) -> Any:
    """PyTorch's softplus (threshold 20: the identity above it)."""
    return xp.where(x > 20, x, xp.log1p(xp.exp(xp.minimum(x, 20))))
