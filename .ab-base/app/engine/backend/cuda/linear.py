"""`linear` on the GPU: quantized GEMV for decode, float16 tensor-core products above it.

One row of x goes to the GEMV kernels, which read the weight's blocks directly (bandwidth-bound,
one pass over the weight); DENSE_FROM_TOKENS to the plan's `mma_max_tokens` rows (none by default) go
to gemv_mma (gemv_mma2.cu by default), which decodes each weight once into tensor-core fragments for all
of them (also one pass). A fused weight (q/k/v, gate/up) is served by one launch over all its parts.
Beyond that, cuBLAS multiplies float16 x by the weight's float16 copy when it has one (dense.py), except
for the formats in the plan's `mma_copy` up to their bound: Q4_K's 0.56 bytes a weight decoded on gemv_mma2
beat the copy's 2 up to 16 tokens (the Qwen3-8B's decode step at 8 sequences 6.52 -> 5.45 ms on an H100),
Q6_K's costlier decode did not (bench/results/gpu-s21-2026-12-06.md). A weight without a copy (a 27B-31B model keeps copies of only
about half its weights) takes products up to the plan's `mma_no_copy` tokens on gemv_mma too, in
launches of up to 64 tokens: the alternative expands the weight to float16 on every call, a write and a
read of 2 bytes a weight on top of the product (2-3x gemv_mma2's time at 32 tokens; a decode step of 32
sequences on a Qwen3.5-27B-shaped Q4_K_M file took 52 ms on an H100 that way, against a memory bound of
~6 ms). Larger products (prefill chunks) multiply slices of the weight's rows expanded into a
scratch buffer, written straight into the output's columns so the scratch stays small even
for a 150k-row vocabulary projection. cuBLAS is called through blas.py, which works
inside CUDA-graph capture (CuPy's wrapper refuses to).

A weight with a repacked copy (`q4r`: Q4_K and Q6_K, made at load when PADDOCK_Q4R_MAX_TOKENS is set:
dense.py) sends products of the plan's q4r token range to gemv_q4r before any of the above: 0.625 or
1.25 bytes a weight through the tensor cores, where the float16 copy is 2.
"""

from __future__ import annotations

from typing import Any

from app.engine.backend.cuda.blas import matmul_t
from app.engine.backend.cuda.dense import DenseCache
from app.engine.backend.cuda.expand import expand_rows
from app.engine.backend.cuda.weights import CudaFusedWeight, CudaWeight
from app.engine.kernels import activation as activation_kernels
from app.engine.kernels import gemv as gemv_kernels
from app.engine.kernels import gemv_int, gemv_mma, gemv_q4r
from app.engine.kernels import norm as norm_kernels
from app.engine.kernels.gemv_plan import DEFAULT_PLAN, MMA_TALL_ROWS, GemvPlan
from app.engine.kernels.gemv_split import gemv_split

GEMV_MAX_TOKENS = gemv_kernels.MAX_TOKENS
SCRATCH_ELEMENTS = 32 << 20  # float16 weight elements per cuBLAS slice (64 MiB)
# From this many tokens products leave the float32-x GEMVs (gemv.cu, gemv_fused.cu: compute-bound from
# 2 tokens) for gemv_mma within the plan's bounds, else for cuBLAS on a float16 copy. Qwen3-8B decode step
# on the H200 (2026-12-01, docs/tuning-log.md): batch 2 3.85 ms on the GEMVs against 5.08 on the copies,
# batch 4 9.91 against 5.16, batch 8 22.0 against 5.38.
DENSE_FROM_TOKENS = 3


def _dense_pays(n_tok: int, weight: CudaWeight | CudaFusedWeight) -> bool:
    return n_tok >= DENSE_FROM_TOKENS and weight.dense16 is not None


def _q4r_serves(n_tok: int, weight: CudaWeight | CudaFusedWeight, plan: GemvPlan) -> bool:
    """Whether this product goes to the weight's repacked copy (gemv_q4r)."""
    return weight.q4r is not None and plan.q4r_serves(n_tok)


def _mma_parts(
    n_tok: int, weight: CudaWeight | CudaFusedWeight, plan: GemvPlan
) -> list[tuple[Any, str, int, int]] | None:
    """The parts as gemv_mma takes them when it serves this product, else None."""
    parts = weight.parts if isinstance(weight, CudaFusedWeight) else (weight,)
    if len(parts) > 3 or any(p.data is None for p in parts):
        return None
    bound = max(plan.mma_max_tokens, _no_copy_bound(weight, plan), _copy_bound(parts, weight, plan))
    if not DENSE_FROM_TOKENS <= n_tok <= bound:
        return None
    if not gemv_mma.serves(min(n_tok, gemv_mma.MAX_TOKENS), [p.qtype.name for p in parts], weight.n_cols):
        return None
    return [(p.data, p.qtype.name, p.row_bytes, p.n_rows) for p in parts]


def _copy_bound(parts: tuple[CudaWeight, ...], weight: CudaWeight | CudaFusedWeight, plan: GemvPlan) -> int:
    """The most tokens gemv_mma takes on a weight with a float16 copy by its formats (plan.mma_copy: where
    decoding the quantized blocks beats reading 2 bytes a weight), the least of its parts'; 0 without one.
    A weight of at least MMA_TALL_ROWS rows whose formats have a bound takes plan.mma_copy_tall where larger."""
    if weight.dense16 is None or not plan.mma_copy:
        return 0
    bound = min(plan.mma_copy.get(p.qtype.name, 0) for p in parts)
    if bound and weight.n_rows >= MMA_TALL_ROWS:
        bound = max(bound, plan.mma_copy_tall)
    return bound


def _no_copy_bound(weight: CudaWeight | CudaFusedWeight, plan: GemvPlan) -> int:
    """The most tokens gemv_mma takes on a weight with no float16 copy (see the module's docstring); 0 with one."""
    return plan.mma_no_copy if weight.dense16 is None else 0


def _gemv_mma(
    parts: list[tuple[Any, str, int, int]], n_cols: int, x: Any, out: Any, bias: Any | None, plan: GemvPlan
) -> Any:
    """gemv_mma (the plan's kernel) over any number of tokens: launches of up to its MAX_TOKENS rows of x
    (a row slice of the C-contiguous `out` is C-contiguous too)."""
    step = gemv_mma.MAX_TOKENS
    for r0 in range(0, x.shape[0], step):
        gemv_mma.gemv_mma(parts, n_cols, x[r0 : r0 + step], out[r0 : r0 + step], bias, kernel=plan.mma_kernel,
                          max_splits=plan.mma_splits)
    return out


def takes_half(n_tok: int, weight: CudaWeight | CudaFusedWeight, plan: GemvPlan = DEFAULT_PLAN) -> bool:
    """Whether `linear` of `n_tok` rows through this single weight runs on float16 x (cuBLAS on its
    float16 copy, or on its rows expanded to float16), casting a float32 x first: a kernel that
    produces x may write it in float16 instead, and `linear` takes it as it is."""
    if isinstance(weight, CudaFusedWeight) or weight.dense is not None or n_tok == 0:
        return False
    if _q4r_serves(n_tok, weight, plan) or _mma_parts(n_tok, weight, plan) is not None:
        return False
    return n_tok > GEMV_MAX_TOKENS or _dense_pays(n_tok, weight)


def _as_input(x: Any, weight: CudaWeight | CudaFusedWeight, plan: GemvPlan) -> Any:
    """x as the product takes it: float16 where it came so and the product reads float16 (takes_half),
    else float32 (no copy when it already is)."""
    import cupy

    if x.dtype == cupy.float16 and x.ndim == 2 and takes_half(x.shape[0], weight, plan):
        x = cupy.ascontiguousarray(x)
    else:
        x = cupy.ascontiguousarray(x, dtype=cupy.float32)
    if x.ndim != 2 or x.shape[1] != weight.n_cols:
        raise ValueError(f"linear {weight.name!r}: x of shape {x.shape} does not match weight {weight.shape}")
    return x


def linear(
    x: Any,
    weight: CudaWeight | CudaFusedWeight,
    bias: Any | None = None,
    cache: DenseCache | None = None,
    plan: GemvPlan = DEFAULT_PLAN,
    out: Any | None = None,
) -> Any:
    """`x @ W.T (+ bias)` for float32 `x [T, in]` (or float16, for a product that reads it: takes_half):
    float32 `[T, out]`; GEMVs launched by `plan`. `out`: a C-contiguous float32 `[T, out]` to write into
    (a fused product's columns at one token)."""
    import cupy

    x = _as_input(x, weight, plan)
    if isinstance(weight, CudaFusedWeight):
        if bias is not None:
            raise ValueError("a fused weight carries its own bias")
        return _linear_fused(x, weight, cache, plan)
    n_tok = x.shape[0]
    if out is None:
        out = cupy.empty((n_tok, weight.n_rows), cupy.float32)
    elif out.shape != (n_tok, weight.n_rows) or out.dtype != cupy.float32 or not out.flags.c_contiguous:
        raise ValueError(f"linear {weight.name!r}: out must be C-contiguous float32 {(n_tok, weight.n_rows)}")
    if n_tok == 0:
        return out
    if _q4r_serves(n_tok, weight, plan):
        return gemv_q4r.gemv_q4r(weight.q4r, x, out, bias)
    mma = _mma_parts(n_tok, weight, plan)
    if weight.dense is not None:
        matmul_t(x, weight.dense, out)
    elif mma is not None:
        return _gemv_mma(mma, weight.n_cols, x, out, bias, plan)
    elif n_tok <= GEMV_MAX_TOKENS and not _dense_pays(n_tok, weight) and weight.layout is not None:
        return gemv_split(
            weight.data, weight.scales, weight.layout, weight.n_rows, weight.n_cols, x, out, bias
        )
    elif n_tok <= GEMV_MAX_TOKENS and not _dense_pays(n_tok, weight):
        return gemv_kernels.gemv(
            weight.data, weight.qtype.name, weight.row_bytes, weight.n_rows, weight.n_cols, x, out, bias,
            plan=plan,
        )  # fmt: skip
    else:
        if cache is not None:
            cache.promote(weight)
        x16 = x if x.dtype == cupy.float16 else x.astype(cupy.float16)
        matmul_quantized(x16, weight, out.data.ptr, weight.n_rows)
    if bias is not None:
        out += bias
    return out


def _gemv_parts(fused: CudaFusedWeight) -> list[tuple[Any, str, int, int]] | None:
    """The parts as gemv_multi takes them, or None when one launch cannot serve them."""
    if not 2 <= len(fused.parts) <= 3 or any(p.data is None or p.split for p in fused.parts):
        return None  # split formats: one GEMV per part
    return [(p.data, p.qtype.name, p.row_bytes, p.n_rows) for p in fused.parts]


def _int_part(part: CudaWeight) -> bool:
    """Whether a part is a whole-block integer format (gemv_int.cu's, when the product is big enough)."""
    return part.data is not None and not part.split and part.qtype.name in gemv_int.INT_X_FORMATS


def one_token_runs(kinds: list[bool]) -> list[range]:
    """The launches of a one-token fused product whose parts are integer formats (True) or not:
    each run of consecutive integer parts, up to three (gemv_int_multi's), in one launch, every
    other part in its own."""
    runs: list[range] = []
    for i, integer in enumerate(kinds):
        last = runs[-1] if runs else None
        if integer and last is not None and kinds[last.start] and len(last) < 3:
            runs[-1] = range(last.start, i + 1)
        else:
            runs.append(range(i, i + 1))
    return runs


def _linear_runs(x: Any, fused: CudaFusedWeight, out: Any, cache: DenseCache | None, plan: GemvPlan) -> Any:
    """One token over a fused weight of more than three parts or of mixed kinds (q/k/v + an output
    gate; Gated DeltaNet's quantized qkv/z beside its F32 beta/alpha): the launches of
    one_token_runs, each writing its columns of `out` in place (at one token a range of columns
    is one contiguous vector), so no part's output is copied into place afterwards."""
    offsets = fused.offsets
    for run in one_token_runs([_int_part(p) for p in fused.parts]):
        group = fused.parts[run.start : run.stop]
        start = offsets[run.start]
        cols = slice(start, start + sum(p.n_rows for p in group))
        bias = None if fused.bias is None else fused.bias[cols]
        if len(group) > 1:
            parts = [(p.data, p.qtype.name, p.row_bytes, p.n_rows) for p in group]
            gemv_kernels.gemv_multi(parts, fused.n_cols, x, out[:, cols], bias, plan=plan)
        else:
            linear(x, group[0], bias, cache, plan, out=out[:, cols])
    return out


def _linear_fused(x: Any, fused: CudaFusedWeight, cache: DenseCache | None, plan: GemvPlan) -> Any:
    import cupy

    n_tok = x.shape[0]
    out = cupy.empty((n_tok, fused.n_rows), cupy.float32)
    if n_tok == 0:
        return out
    if _q4r_serves(n_tok, fused, plan):
        return gemv_q4r.gemv_q4r(fused.q4r, x, out, fused.bias)
    mma = _mma_parts(n_tok, fused, plan)
    if mma is not None:
        return _gemv_mma(mma, fused.n_cols, x, out, fused.bias, plan)
    parts = _gemv_parts(fused)
    mixed = len({_int_part(p) for p in fused.parts}) > 1
    if n_tok == 1 and (parts is None or mixed):
        return _linear_runs(x, fused, out, cache, plan)
    dense = _dense_pays(n_tok, fused)
    if n_tok <= GEMV_MAX_TOKENS and parts is not None and not dense:
        return gemv_kernels.gemv_multi(parts, fused.n_cols, x, out, fused.bias, plan=plan)
    if (n_tok <= GEMV_MAX_TOKENS and not dense) or any(p.data is None for p in fused.parts):
        for part, start in zip(fused.parts, fused.offsets, strict=True):
            out[:, start : start + part.n_rows] = linear(x, part, cache=cache, plan=plan)
    elif fused.dense16 is not None:
        matmul_t(x.astype(cupy.float16), fused.dense16, out)
    else:
        x16 = x.astype(cupy.float16)
        for part, start in zip(fused.parts, fused.offsets, strict=True):
            matmul_quantized(x16, part, out.data.ptr + 4 * start, fused.n_rows)
    if fused.bias is not None:
        out += fused.bias
    return out


def gated_linear(
    x: Any, fused: CudaFusedWeight, kind: str, cache: DenseCache | None = None, plan: GemvPlan = DEFAULT_PLAN,
    then: CudaWeight | None = None,
) -> Any:  # fmt: skip
    """`act(x @ G.T) * (x @ U.T)` for a fused (gate, up) weight: float32 `[T, rows]`, or float16 where the
    product ends in the activation kernel and `then`, the weight the result goes into next, reads float16
    (takes_half: the cast `linear` would make, done by the activation's store)."""
    import cupy

    gate, up = fused.parts
    x = _as_input(x, fused, plan)
    n_tok = x.shape[0]
    gemv = (
        0 < n_tok <= GEMV_MAX_TOKENS
        and not _dense_pays(n_tok, fused)
        and _mma_parts(n_tok, fused, plan) is None
        and not _q4r_serves(n_tok, fused, plan)
    )
    if gemv and fused.bias is None and _gemv_parts(fused) is not None:
        out = cupy.empty((n_tok, gate.n_rows), cupy.float32)
        return gemv_kernels.gemv_gated(
            (gate.data, gate.qtype.name, gate.row_bytes), (up.data, up.qtype.name, up.row_bytes),
            gate.n_rows, gate.n_cols, x, kind, out, plan=plan,
        )  # fmt: skip
    if _q4r_gates(n_tok, fused, kind, plan):
        return gemv_q4r.gemv_q4r(fused.q4r, x, cupy.empty((n_tok, gate.n_rows), cupy.float32), act=kind)
    both = _linear_fused(x, fused, cache, plan)
    half = then is not None and takes_half(n_tok, then, plan)
    out = cupy.empty((n_tok, gate.n_rows), cupy.float16 if half else cupy.float32)
    return activation_kernels.gated_pairs(both, kind, out)


def _q4r_gates(n_tok: int, fused: CudaFusedWeight, kind: str, plan: GemvPlan) -> bool:
    """Whether gemv_q4r takes this gate/up product with its activation in the epilogue (interleaved tiles)."""
    return (
        _q4r_serves(n_tok, fused, plan) and fused.q4r.interleaved and fused.bias is None
        and kind in gemv_q4r.ACTIVATIONS
    )  # fmt: skip


def norm_linear(
    x: Any, residual: Any | None, norm_weight: Any, eps: float, fused: CudaFusedWeight, kind: str | None,
    plan: GemvPlan = DEFAULT_PLAN,
) -> tuple[Any, Any] | None:  # fmt: skip
    """One token's add + RMSNorm and the product after it in one launch (gemv_int.cu's fused
    prologue): `(linear or gated_linear of the normalized x, new residual)`, with `kind` the
    activation for a (gate, up) pair and None for q/k/v. None when that kernel cannot serve or
    would be slower: more than one token, float weights, a biased gate/up, the int16-x path off,
    or an x wider than the plan's norm_max_cols."""
    import cupy

    parts = _gemv_parts(fused)
    if kind is None and len(fused.parts) > 3 and all(_int_part(p) for p in fused.parts):
        parts = [(p.data, p.qtype.name, p.row_bytes, p.n_rows) for p in fused.parts]  # q/k/v + an output gate
    if x.shape[0] != 1 or parts is None or (kind is not None and (len(parts) != 2 or fused.bias is not None)):
        return None
    if _q4r_serves(1, fused, plan):
        return None  # the norm on its own, then gemv_q4r
    if not plan.int_x or fused.n_cols > plan.norm_max_cols:
        return None
    runs = one_token_runs([True] * len(parts))
    if not all(gemv_int.serves(1, fused.n_cols, [p[1] for p in parts[r.start : r.stop]]) for r in runs):
        return None
    new_residual = cupy.empty_like(x)
    norm = gemv_int.NormIn(residual, norm_weight, new_residual, eps)
    if kind is None:
        # Each launch normalizes x itself (a block's share of the norm is one read of x from L2);
        # every one writes the same new residual.
        out = cupy.empty((1, fused.n_rows), cupy.float32)
        for run in runs:
            start = fused.offsets[run.start]
            cols = slice(start, start + sum(p[3] for p in parts[run.start : run.stop]))
            bias = None if fused.bias is None else fused.bias[cols]
            group = parts[run.start : run.stop]
            if len(group) == 1:
                gemv_int.gemv_int(*group[0][:3], group[0][3], fused.n_cols, x, out[:, cols], bias, norm=norm, plan=plan)
            else:
                gemv_int.gemv_int_multi(group, fused.n_cols, x, out[:, cols], bias, norm=norm, plan=plan)
    else:
        rows = parts[0][3]
        out = cupy.empty((1, rows), cupy.float32)
        gemv_int.gemv_int_gated(parts[0][:3], parts[1][:3], rows, fused.n_cols, x, gemv_kernels.ACTIVATIONS[kind],
                                out, norm=norm, plan=plan)  # fmt: skip
    return out, new_residual


def norm_dense_linear(
    x: Any, residual: Any | None, norm_weight: Any, eps: float, fused: CudaFusedWeight, kind: str | None,
    plan: GemvPlan = DEFAULT_PLAN, then: CudaWeight | None = None,
) -> tuple[Any, Any] | None:  # fmt: skip
    """Add + RMSNorm written in float16 by the norm kernel itself for the product on the fused weight's
    float16 copy or its repacked one, where `linear` would cast the normalized x in a kernel of its
    own (the same rounding: the result is the composition's): `(linear or gated_linear of the normalized
    x, new residual)`, or None where the product takes another path or the norm kernel cannot write the rows.
    `then`: the weight a gated result goes into next (the down projection); where that product reads
    float16 (takes_half), the activation writes its result in float16, the cast `linear` would make."""
    import cupy

    n_tok, n_cols = x.shape
    q4r = _q4r_serves(n_tok, fused, plan)
    if not q4r and (not _dense_pays(n_tok, fused) or _mma_parts(n_tok, fused, plan) is not None):
        return None
    if any(p.data is None for p in fused.parts):
        return None  # _linear_fused goes part by part there
    if kind is not None and (len(fused.parts) != 2 or fused.parts[0].shape != fused.parts[1].shape):
        return None  # not a (gate, up) pair: the composition says so
    normed = cupy.empty((n_tok, n_cols), cupy.float16)
    new_residual = None if residual is None else cupy.empty_like(x)
    arrays = (x, norm_weight, normed) if residual is None else (x, residual, norm_weight, normed, new_residual)
    if not norm_kernels.half_serves(n_cols, *arrays):
        return None
    norm_kernels.rms_norm_half(x, residual, norm_weight, eps, normed, new_residual)
    if kind is not None and _q4r_gates(n_tok, fused, kind, plan):
        out = cupy.empty((n_tok, fused.parts[0].n_rows), cupy.float32)
        gemv_q4r.gemv_q4r(fused.q4r, normed, out, act=kind)
        return out, (x if residual is None else new_residual)
    out = cupy.empty((n_tok, fused.n_rows), cupy.float32)
    if q4r:
        gemv_q4r.gemv_q4r(fused.q4r, normed, out, fused.bias)
    else:
        matmul_t(normed, fused.dense16, out)
        if fused.bias is not None:
            out += fused.bias
    if kind is not None:
        half = then is not None and takes_half(n_tok, then, plan)
        act = cupy.empty((n_tok, fused.parts[0].n_rows), cupy.float16 if half else cupy.float32)
        out = activation_kernels.gated_pairs(out, kind, act)
    return out, (x if residual is None else new_residual)


def matmul_quantized(x16: Any, weight: CudaWeight, out_ptr: int, ldc: int) -> None:
    """float32 `x @ W.T` for float16 `x16 [T, in]`, into the `weight.n_rows` columns at `out_ptr`
    of a row-major float32 output whose rows are `ldc` elements apart."""
    import cupy

    if weight.dense16 is not None:
        matmul_t(x16, weight.dense16, None, out_ptr=out_ptr, ldc=ldc)
        return
    n_rows, n_cols = weight.shape
    # Slices of a multiple of 128 rows keep each slice's output column 512-byte aligned: an
    # unaligned output made cuBLAS 3x slower (docs/tuning-log.md).
    rows_per_slice = min(n_rows, max(128, SCRATCH_ELEMENTS // n_cols // 128 * 128))
    scratch = cupy.empty((rows_per_slice, n_cols), cupy.float16)
    for r0 in range(0, n_rows, rows_per_slice):
        rows = min(rows_per_slice, n_rows - r0)
        w16 = scratch[:rows]
        expand_rows(weight, w16, row_offset=r0)
        matmul_t(x16, w16, None, out_ptr=out_ptr + 4 * r0, ldc=ldc)
