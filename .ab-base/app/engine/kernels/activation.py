"""Wrapper of activation.cu: gated activations, the attention output gate and the soft cap."""

from __future__ import annotations

from typing import Any

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, f32, i32, i64, launch

THREADS = 256
GATED_KERNELS = {"silu": "gated_silu", "gelu_tanh": "gated_gelu_tanh"}


def gated(gate: Any, up: Any, kind: str, out: Any) -> Any:
    try:
        name = GATED_KERNELS[kind]
    except KeyError:
        raise ValueError(f"unknown activation {kind!r}; expected one of {sorted(GATED_KERNELS)}") from None
    n = gate.size
    if n:
        launch(get_kernel("activation.cu", name), (cdiv(n, THREADS),), (THREADS,), (gate, up, out, i64(n)))
    return out


def gated_pairs(gate_up: Any, kind: str, out: Any) -> Any:
    """`act(g) * u` for `gate_up [T, 2F]` holding gate and up side by side: `out [T, F]`, float32, or
    float16 (rounded to nearest) for a product that reads float16."""
    if kind not in GATED_KERNELS:
        raise ValueError(f"unknown activation {kind!r}; expected one of {sorted(GATED_KERNELS)}")
    n, f = out.size, out.shape[-1]
    if gate_up.shape[-1] != 2 * f:
        raise ValueError(f"gate_up of shape {gate_up.shape} does not hold two halves of {f}")
    if out.dtype.name not in ("float32", "float16"):
        raise ValueError(f"gated_pairs writes float32 or float16, not {out.dtype}")
    if n:
        half = "_h" if out.dtype.name == "float16" else ""
        kernel = get_kernel("activation.cu", f"gated_pairs_{kind}{half}")
        vec = pairs_vector(f, gate_up.data.ptr, out.data.ptr)
        launch(kernel, (cdiv(cdiv(n, vec), THREADS),), (THREADS,), (gate_up, out, i64(n), i32(f), i32(vec)))
    return out


def pairs_vector(f: int, gate_up_ptr: int, out_ptr: int) -> int:
    """Elements per thread of gated_pairs (its vec): 4 where a row's halves and the output split into 16-byte
    loads and aligned stores (f a multiple of 4, both arrays 16-byte aligned), else 1."""
    return 4 if f % 4 == 0 and gate_up_ptr % 16 == 0 and out_ptr % 16 == 0 else 1


def softcap(x: Any, cap: float, out: Any) -> Any:
    n = x.size
    if n:
        launch(
            get_kernel("activation.cu", "softcap"),
            (cdiv(n, THREADS),),
            (THREADS,),
            (x, out, i64(n), f32(cap)),
        )
    return out


OUTPUT_GATES = ("sigmoid", "softplus")


def output_gate(out: Any, gate: Any, kind: str, y: Any) -> Any:
    """`y = out * f(gate)` for the attention output `out [T, W]` (contiguous) and its gate `gate [T, W]`
    or `[T, heads]` (one column per head, over W / heads dims), whose rows may be strided (a column
    slice of the fused projection: read in place); f is sigmoid or softplus (`kind`)."""
    if kind not in OUTPUT_GATES:
        raise ValueError(f"unknown output gate {kind!r}; expected one of {OUTPUT_GATES}")
    n_tok, width = out.shape
    cols = gate.shape[1]
    if gate.shape[0] != n_tok or not cols or width % cols or gate.strides[1] != 4:
        raise ValueError(f"gate {gate.shape} (strides {gate.strides}) does not gate an output of {out.shape}")
    n = out.size
    if n:
        launch(get_kernel("activation.cu", f"output_gate_{kind}"), (cdiv(n, THREADS),), (THREADS,),
               (out, gate, y, i64(n), i32(width), i64(gate.strides[0] // 4), i32(width // cols)))  # fmt: skip
    return y
