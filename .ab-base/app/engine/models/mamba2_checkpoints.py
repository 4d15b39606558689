"""What Nemotron-H and Granite 4 hybrid checkpoints say about their Mamba-2 layers, read once for both
families (models/nemotron_h.py, models/granite_hybrid.py).

GGUF (llama.cpp's converter, Mamba2Model): `{arch}.ssm.conv_kernel`, `.state_size`, `.group_count`,
`.inner_size` (d_inner) and `.time_step_rank` (the number of heads: llama.cpp reuses the key); the
per-layer kind comes from arrays that are 0 where a layer lacks the part (`attention.head_count_kv`,
`feed_forward_length`). Tensors: `ssm_a` holds -exp(A_log) ([H, 1]), `ssm_d` [H, 1], `ssm_dt.bias`,
`ssm_conv1d.weight` [C, K] (squeezed), `ssm_norm.weight` [G, d_inner / G].
Hugging Face folders hold A_log, which `a_from_a_log` turns into GGUF's A.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.engine.loader.names import CheckpointError
from app.engine.models.config import Mamba2Spec, size
from app.engine.models.family import Tensors
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES


def spec_from_gguf(meta: dict[str, Any]) -> Mamba2Spec:
    arch = meta["general.architecture"]

    def need(key: str) -> int:
        full = f"{arch}.ssm.{key}"
        if full not in meta:
            raise CheckpointError(f"metadata has no {full}")
        return size(meta[full], full, "hidden_size")

    heads, inner = need("time_step_rank"), need("inner_size")
    if inner % heads:
        raise CheckpointError(
            f"{arch}.ssm.inner_size = {inner} is not a multiple of {arch}.ssm.time_step_rank = {heads}"
        )
    return _checked(
        Mamba2Spec(
            num_heads=heads,
            head_dim=inner // heads,
            state_size=need("state_size"),
            n_groups=need("group_count"),
            conv_kernel=need("conv_kernel"),
        ),
        f"{arch}.ssm.group_count",
    )


def spec_from_hf(cfg: dict[str, Any], keys: dict[str, tuple[str, ...]], chunk_default: int) -> Mamba2Spec:
    """`keys`: per Mamba2Spec field, the config.json names it goes by (the first present is read)."""

    def read(field: str, default: Any = None) -> int:
        for key in keys[field]:
            if cfg.get(key) is not None:
                return size(cfg[key], f"config.json {key}", "hidden_size")
        if default is not None:
            return default
        raise CheckpointError(f"config.json has no {keys[field][0]}")

    spec = Mamba2Spec(
        num_heads=read("num_heads"),
        head_dim=read("head_dim"),
        state_size=read("state_size"),
        n_groups=read("n_groups", 1),
        conv_kernel=read("conv_kernel", 4),
        chunk_size=read("chunk_size", chunk_default),
    )
    return _checked(spec, f"config.json {keys['n_groups'][0]}")


def _checked(spec: Mamba2Spec, groups_key: str) -> Mamba2Spec:
    if spec.num_heads % spec.n_groups:
        raise CheckpointError(
            f"{groups_key} = {spec.n_groups} does not divide the {spec.num_heads} Mamba-2 heads"
        )
    return spec


def per_layer(meta: dict[str, Any], key: str, layers: int) -> list[int]:
    """A per-layer GGUF value: an array of `layers` entries, or one number for every layer."""
    value = meta.get(key)
    if value is None:
        raise CheckpointError(f"metadata has no {key}")
    values = [value] * layers if isinstance(value, int | float) else list(value)
    if len(values) != layers or any(not isinstance(v, int) or v < 0 for v in values):
        raise CheckpointError(f"{key} is {value!r}: expected {layers} whole numbers, one per layer")
    return values


def a_from_a_log(tensors: Tensors) -> Tensors:
    """Hugging Face's A_log (under the GGUF name `ssm_a`) as the A = -exp(A_log) GGUF stores."""
    adapted = dict(tensors)
    for name, tensor in tensors.items():
        if name.endswith(".ssm_a"):
            values = -np.exp(tensor.dequantize().astype(np.float32))  # in float32, as transformers does
            adapted[name] = QuantizedTensor.from_float(name, values, QUANT_TYPES["F32"])
    return adapted


def rows(name: str, tensor: QuantizedTensor, lo: int, hi: int) -> QuantizedTensor:
    """Rows lo..hi of the second-to-last axis (one half of a fused gate/up projection, of each expert
    when stacked), in the file's format: whole rows are picked, no value changes."""
    *lead, n_rows, cols = tensor.shape
    if tensor.scales is not None:  # a split format's scale grid is per row group: go through floats
        values = np.ascontiguousarray(tensor.dequantize()[..., lo:hi, :])
        return QuantizedTensor.from_float(name, values, QUANT_TYPES["F32"])
    picked = (np.arange(math.prod(lead))[:, None] * n_rows + np.arange(lo, hi)[None, :]).reshape(-1)
    return QuantizedTensor(
        name, tensor.qtype, (*lead, hi - lo, cols), np.ascontiguousarray(tensor.data[picked])
    )
