"""Mamba-2 (SSD) mixer (Nemotron-H, Granite 4 hybrid).

Contract with the decoder (models/decoder.py) and the runner:
- `Mamba2(backend, tensors, prefix, spec: Mamba2Spec, eps)` builds from the layer's
  tensors under `prefix` ("blk.3"), in the GGUF names llama.cpp uses for nemotron_h/granitehybrid.
- `__call__(x [T, hidden], meta, state) -> [T, hidden]`, where `state = (conv_state, ssm_state)`
  are the layer's arrays `[num_slots, *shape]` for `spec.state_shapes()` (float32). Sequence i of the
  batch owns flat rows `meta.query_start_loc[i]:[i+1]`, its state row is `meta.state_slots[i]`, and it
  continues that state when `meta.has_initial_state[i]`, else starts from zeros. The layer updates the
  rows in place so the next chunk / decode step continues from them.

One step, as transformers' `torch_forward` and llama.cpp's `build_mamba2_layer` compute it: `ssm_in`
projects to z (the gate, d_inner), xBC (d_inner + 2 G N) and dt (one per head), in that order; a
depthwise causal conv with bias and SiLU runs over xBC; dt = softplus(dt + dt_bias); the scan
(backend/ssd_reference.py) with A (`ssm_a`, already -exp(A_log) as llama.cpp's converter stores it)
and the D skip; then `y * silu(z)` normalised by RMS within each of the G groups of d_inner / G
channels (MambaRMSNormGated, norm_before_gate=False) and scaled by `ssm_norm`; then `ssm_out`.
Between the two projections everything is a backend op (`causal_conv1d`, `ssd_scan` with dt's softplus
inside, `gated_group_rms_norm`): the references on numpy, one kernel launch each on CUDA (kernels/ssd.py),
which reads every sequence's rows and state row on the device, so a decode step can be captured.

Neither reference clamps dt on decode; transformers' Nemotron-H clamps it below at time_step_min in
its chunked prefill only, llama.cpp never: we follow llama.cpp (dt below 1e-3 needs dt + dt_bias
below -6.9, which trained checkpoints keep clear of).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata
from app.engine.layers.linear import Linear
from app.engine.loader.names import CheckpointError
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.specs import Mamba2Spec


class Mamba2:
    def __init__(
        self, backend: Any, tensors: dict[str, QuantizedTensor], prefix: str, spec: Mamba2Spec, eps: float
    ) -> None:
        self.backend, self.spec, self.eps = backend, spec, eps

        def need(name: str) -> QuantizedTensor:
            tensor = tensors.get(f"{prefix}.{name}")
            if tensor is None:
                raise CheckpointError(f"tensor {prefix}.{name} (Mamba-2 layer) is missing")
            return tensor

        def small(name: str, shape: tuple[int, ...], optional: bool = False) -> Any:
            """A small parameter as float32 in `shape` (checkpoints store some with unit axes:
            GGUF's A and D are [H, 1], its norm [G, d_inner / G], Hugging Face's conv [C, 1, K])."""
            if optional and f"{prefix}.{name}" not in tensors:
                return None
            tensor = need(name)
            if math.prod(tensor.shape) != math.prod(shape):
                raise CheckpointError(
                    f"tensor {tensor.name!r} has shape {tensor.shape}; this Mamba-2 layer needs {shape} "
                    f"({spec.num_heads} heads of {spec.head_dim}, {spec.n_groups} groups, state {spec.state_size}, "
                    f"conv kernel {spec.conv_kernel})"
                )
            return backend.from_host(np.ascontiguousarray(tensor.dequantize(), np.float32).reshape(shape))

        heads, inner, conv_dim = spec.num_heads, spec.d_inner, spec.conv_dim
        self.in_proj = Linear(backend, need("ssm_in.weight"), tensors.get(f"{prefix}.ssm_in.bias"))
        if self.in_proj.out_features != inner + conv_dim + heads:
            raise CheckpointError(
                f"tensor {prefix}.ssm_in.weight has {self.in_proj.out_features} rows; z, xBC and dt of this "
                f"Mamba-2 layer make {inner} + {conv_dim} + {heads} = {inner + conv_dim + heads}"
            )
        self.conv_weight = small("ssm_conv1d.weight", (conv_dim, spec.conv_kernel))
        self.conv_bias = small("ssm_conv1d.bias", (conv_dim,), optional=True)
        self.dt_bias = small("ssm_dt.bias", (heads,))
        self.a = small("ssm_a", (heads,))
        self.d = small("ssm_d", (heads,))
        self.norm = small("ssm_norm.weight", (inner,))
        self.out_proj = Linear(backend, need("ssm_out.weight"), tensors.get(f"{prefix}.ssm_out.bias"))

    def __call__(self, x: Any, meta: AttentionMetadata, state: tuple[Any, Any]) -> Any:
        s, xp = self.spec, self.backend.xp
        conv_state, ssm_state = state
        n, inner, groups = x.shape[0], s.d_inner, s.n_groups * s.state_size
        projected = self.in_proj(x).astype(xp.float32, copy=False)
        z, xbc, dt = (
            projected[:, :inner],
            projected[:, inner : inner + s.conv_dim],
            projected[:, inner + s.conv_dim :],
        )
        xbc = self.backend.causal_conv1d(xbc, self.conv_weight, self.conv_bias, conv_state, meta, silu=True)
        heads_x = xbc[:, :inner].reshape(n, s.num_heads, s.head_dim)
        b = xbc[:, inner : inner + groups].reshape(n, s.n_groups, s.state_size)
        c = xbc[:, inner + groups :].reshape(n, s.n_groups, s.state_size)
        y = self.backend.ssd_scan(heads_x, dt, self.dt_bias, self.a, b, c, self.d, ssm_state, meta, s.chunk_size)
        y = self.backend.gated_group_rms_norm(y.reshape(n, inner), z, self.norm, self.eps, s.n_groups)
        return self.out_proj(y.astype(self.backend.act_dtype, copy=False))

