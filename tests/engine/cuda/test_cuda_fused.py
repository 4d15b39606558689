"""Fused ops on CUDA (q/k/v GEMV, gate/up + activation, QK-norm + RoPE + KV write) against the
numpy backend, which runs them as the unfused compositions; the float16 weight cache; cuBLAS
inside a CUDA-graph capture."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import (
    F16_TOL,
    GATED_FACTOR,
    INT_X_TOL,
    dequantize_oracle,
    linear_tol,
    random_tensor,
    rel_err,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["auto", "off"])
def cuda_cache(request, cuda):
    """Backends with and without the float16 weight cache (products above 8 tokens differ)."""
    from app.engine.backend.cuda.backend import CudaBackend

    return CudaBackend(dense_cache=request.param)


def _load(backends, tensors):
    return [[b.load_weight(t) for t in tensors] for b in backends]


@pytest.mark.parametrize("n_tok", [1, 3, 8, 9, 40])
@pytest.mark.parametrize(("formats", "rows"), [
    (("Q4_K", "Q4_K", "Q6_K"), (256, 128, 128)), (("Q8_0", "Q5_0", "F16"), (70, 33, 33)), (("Q4_K", "Q4_K"), (97, 97)),
])  # fmt: skip
def test_fused_linear(cuda_cache, cpu, rng, formats, rows, n_tok: int) -> None:
    cols = 1024
    tensors = [
        random_tensor(q, r, cols, rng, name=f"blk.0.w{i}")
        for i, (q, r) in enumerate(zip(formats, rows, strict=True))
    ]
    biases = [rng.standard_normal(r).astype(np.float32) if i != 1 else None for i, r in enumerate(rows)]
    (gpu_w, cpu_w) = _load((cuda_cache, cpu), tensors)
    gpu_fused = cuda_cache.fuse_linear(
        gpu_w, [None if b is None else cuda_cache.from_host(b) for b in biases]
    )
    cpu_fused = cpu.fuse_linear(cpu_w, biases)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    got = cuda_cache.to_host(cuda_cache.linear(cuda_cache.from_host(x), gpu_fused))
    ref = cpu.linear(x, cpu_fused)
    assert got.shape == ref.shape and not np.isnan(got).any()
    dense = gpu_fused.dense16 is not None
    assert rel_err(got, ref) < linear_tol(n_tok, cols, formats, sum(t.data.nbytes for t in tensors), dense)


@pytest.mark.parametrize("n_tok", [1, 2, 5, 8, 20])
@pytest.mark.parametrize(("formats", "kind"), [
    (("Q4_K", "Q4_K"), "silu"), (("Q6_K", "Q4_K"), "gelu_tanh"), (("Q8_0", "Q8_0"), "gelu_tanh"),
])  # fmt: skip
def test_gated_linear(cuda_cache, cpu, rng, formats, kind: str, n_tok: int) -> None:
    rows, cols = 301, 2048
    tensors = [random_tensor(q, rows, cols, rng, name=f"blk.0.ffn{i}") for i, q in enumerate(formats)]
    (gpu_w, cpu_w) = _load((cuda_cache, cpu), tensors)
    x = (rng.standard_normal((n_tok, cols)) * 0.02).astype(np.float32)  # gate values ~ O(1)
    fused = cuda_cache.fuse_linear(gpu_w, [None, None])
    got = cuda_cache.gated_linear(cuda_cache.from_host(x), fused, kind)
    ref = cpu.gated_linear(x, cpu.fuse_linear(cpu_w, [None, None]), kind)
    assert rel_err(cuda_cache.to_host(got), ref) < GATED_FACTOR * linear_tol(
        n_tok, cols, formats, sum(t.data.nbytes for t in tensors), fused.dense16 is not None
    )


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize(("n_tok", "heads", "qk_norm"), [
    (1, (16, 8, 128), True), (7, (4, 1, 256), True), (33, (32, 8, 128), False), (3, (8, 2, 64), False),
])  # fmt: skip
def test_rope_and_cache(cuda, cpu, rng, n_tok: int, heads, qk_norm: bool, interleaved: bool) -> None:
    n_heads, n_kv, d = heads
    blocks, block, max_pos = 6, 16, 1000
    inv = 1.0 / (10000.0 ** (np.arange(0, d, 2) / d))
    angles = np.arange(max_pos)[:, None] * inv[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    qkv = rng.standard_normal((n_tok, (n_heads + 2 * n_kv) * d)).astype(np.float32)
    pos = rng.integers(0, max_pos, n_tok).astype(np.int32)
    slots = rng.choice(blocks * block, n_tok, replace=False).astype(np.int32)
    norms = [rng.standard_normal(d).astype(np.float32) if qk_norm else None for _ in range(2)]
    k_ref, v_ref = cpu.alloc_kv_cache(blocks, block, n_kv, d)
    q_ref = cpu.rope_and_cache(qkv, n_heads, n_kv, d, *norms, 1e-6, pos, cpu.rope_table(cos, sin), interleaved,
                               k_ref, v_ref, slots)  # fmt: skip
    k_gpu, v_gpu = cuda.alloc_kv_cache(blocks, block, n_kv, d)
    gpu_norms = [None if w is None else cuda.from_host(w) for w in norms]
    q = cuda.rope_and_cache(cuda.from_host(qkv), n_heads, n_kv, d, *gpu_norms, 1e-6, cuda.from_host(pos),
                            cuda.rope_table(cos, sin), interleaved, k_gpu, v_gpu, cuda.from_host(slots))  # fmt: skip
    assert rel_err(cuda.to_host(q), q_ref) < 2e-6
    k_got = cuda.to_host(k_gpu).reshape(-1, n_kv, d)[slots].astype(np.float32)
    v_got = cuda.to_host(v_gpu).reshape(-1, n_kv, d)[slots]
    assert rel_err(k_got, k_ref.reshape(-1, n_kv, d)[slots]) < 1e-3  # float16 cache
    np.testing.assert_array_equal(v_got, v_ref.reshape(-1, n_kv, d)[slots].astype(np.float16))


def test_rope_and_cache_skips_padding_slots(cuda, rng) -> None:
    n_heads, n_kv, d = 4, 2, 64
    table = cuda.rope_table(np.ones((64, 32), np.float32), np.zeros((64, 32), np.float32))
    k_gpu, v_gpu = cuda.alloc_kv_cache(2, 16, n_kv, d)
    k_gpu[...] = 7.0
    qkv = cuda.from_host(rng.standard_normal((2, (n_heads + 2 * n_kv) * d)).astype(np.float32))
    slots = cuda.from_host(np.array([-1, 5], np.int32))
    cuda.rope_and_cache(qkv, n_heads, n_kv, d, None, None, 0.0, cuda.from_host(np.zeros(2, np.int32)), table, False,
                        k_gpu, v_gpu, slots)  # fmt: skip
    k = cuda.to_host(k_gpu).reshape(-1, n_kv, d)
    assert (k[np.arange(32) != 5] == 7.0).all()


def test_dense_cache_policy(cuda, rng) -> None:
    from app.engine.backend.cuda.backend import CudaBackend

    embed = random_tensor("Q4_K", 64, 256, rng, name="token_embd.weight")
    proj = random_tensor("Q4_K", 64, 256, rng, name="blk.0.attn_q.weight")
    off, on, auto = (CudaBackend(dense_cache=m) for m in ("off", "on", "auto"))
    assert off.load_weight(proj).dense16 is None
    assert on.load_weight(embed).dense16 is not None
    assert auto.load_weight(proj).dense16 is not None
    cold = auto.load_weight(embed)
    assert cold.dense16 is None  # embedding tables wait for a product that would expand them (tied output head)
    auto.linear(auto.from_host(rng.standard_normal((12, 256)).astype(np.float32)), cold)
    assert cold.dense16 is None  # 3..64 rows: gemv_mma reads the quantized blocks, nothing to expand
    x = rng.standard_normal((70, 256)).astype(np.float32)
    auto.linear(auto.from_host(x), cold)
    assert cold.dense16 is not None and "2 matrices" in auto.dense_cache.summary()
    with pytest.raises(ValueError, match="dense_cache"):
        CudaBackend(dense_cache="sometimes")


def test_fused_float16_copies_are_stacked(cuda, rng) -> None:
    from app.engine.backend.cuda.backend import CudaBackend

    backend = CudaBackend(dense_cache="on")
    parts = [backend.load_weight(random_tensor("Q4_K", r, 256, rng, name=f"p{r}")) for r in (32, 16)]
    fused = backend.fuse_linear(parts, [None, None])
    assert fused.dense16 is not None and fused.dense16.shape == (48, 256)
    assert parts[1].dense16.data.ptr == fused.dense16[32:].data.ptr  # views, no second copy


@pytest.mark.parametrize("mode", ["on", "off"])
def test_cublas_inside_graph_capture(cuda, rng, mode: str) -> None:
    """Products on cuBLAS (above gemv_mma's 64 rows without a copy) can be captured and replayed."""
    import cupy

    from app.engine.backend.cuda.backend import CudaBackend

    backend = CudaBackend(dense_cache=mode)
    weight = backend.load_weight(random_tensor("Q6_K", 300, 512, rng, name="blk.0.ffn_down.weight"))
    x = cupy.asarray(rng.standard_normal((80, 512)).astype(np.float32))
    eager = backend.to_host(backend.linear(x, weight))
    cupy.cuda.Device().synchronize()  # the side stream does not wait for the default one
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        backend.linear(x, weight)  # warm-up: sizes the memory pool's blocks
        stream.synchronize()
        stream.begin_capture()
        out = backend.linear(x, weight)
        graph = stream.end_capture()
    x[...] = cupy.asarray(rng.standard_normal((80, 512)).astype(np.float32))
    graph.launch(stream=cupy.cuda.Stream.null)
    cupy.cuda.Stream.null.synchronize()
    np.testing.assert_allclose(
        backend.to_host(out), backend.to_host(backend.linear(x, weight)), rtol=1e-5, atol=1e-4
    )
    assert not np.allclose(backend.to_host(out), eager)  # the replay read the new x


@pytest.mark.parametrize(("formats", "kind"), [(("Q4_K", "Q4_K"), "silu"), (("Q6_K", "Q8_0"), "gelu_tanh")])
def test_gated_linear_large_single_token_takes_int_x(cuda, cpu, rng, formats, kind: str) -> None:
    """Gate/up of the 8B shapes at one token run gemv_int.cu's gated kernel (int16 x)."""
    from app.engine.kernels import gemv_int

    rows, cols = 12288, 4096
    tensors = [random_tensor(q, rows, cols, rng, name=f"blk.0.ffn{i}") for i, q in enumerate(formats)]
    nbytes = sum(t.data.nbytes for t in tensors)
    assert cuda.gemv_plan.int_x and gemv_int.serves(1, cols, formats, nbytes)
    (gpu_w, cpu_w) = _load((cuda, cpu), tensors)
    x = (rng.standard_normal((1, cols)) * 0.02).astype(np.float32)
    got = cuda.gated_linear(cuda.from_host(x), cuda.fuse_linear(gpu_w, [None, None]), kind)
    ref = cpu.gated_linear(x, cpu.fuse_linear(cpu_w, [None, None]), kind)
    assert rel_err(cuda.to_host(got), ref) < GATED_FACTOR * linear_tol(1, cols, formats, nbytes)


@pytest.mark.parametrize("formats", [("Q4_K", "Q4_K", "Q6_K"), ("Q8_0", "Q5_K")])
def test_gemv_int_multi_matches_stacked_product(cuda, rng, formats) -> None:
    """gemv_int_multi (benchmarked against the float kernel for q/k/v): one or two copies of x."""
    import cupy

    from app.engine.kernels import gemv_int

    cols, rows = 4096, [4099, 1024, 1031][: len(formats)]
    tensors = [random_tensor(q, r, cols, rng) for q, r in zip(formats, rows, strict=True)]
    weights = [cuda.load_weight(t) for t in tensors]
    parts = [(w.data, q, w.row_bytes, r) for w, q, r in zip(weights, formats, rows, strict=True)]
    x = rng.standard_normal((1, cols)).astype(np.float32)
    out = cupy.full((1, sum(rows)), cupy.nan, cupy.float32)
    gemv_int.gemv_int_multi(parts, cols, cupy.asarray(x), out)
    w = np.concatenate([dequantize_oracle(t) for t in tensors]).astype(np.float64)
    got = cupy.asnumpy(out)
    assert not np.isnan(got).any()
    assert rel_err(got, x.astype(np.float64) @ w.T) < linear_tol(1, cols, formats, gemv_int.MIN_BYTES)


@pytest.mark.parametrize("n_tok", [1, 3, 9])
@pytest.mark.parametrize(("formats", "rows"), [
    (("Q4_K", "Q4_K", "Q6_K", "F32"), (2048, 256, 256, 96)),  # Gated DeltaNet's qkv, z, beta|alpha
    (("Q4_K", "Q4_K", "Q6_K", "Q4_K"), (2048, 256, 256, 2048)),  # q/k/v and an output gate
    (("F32", "Q8_0", "Q8_0", "Q8_0", "Q8_0", "BF16"), (40, 512, 512, 512, 512, 64)),
])  # fmt: skip
def test_fused_linear_mixed_parts(cuda, cpu, rng, formats, rows, n_tok: int) -> None:
    """A fused weight of more than three parts or of integer and float parts side by side: at one token
    one launch per run of integer parts and one per other part, each writing its own columns."""
    from app.engine.backend.cuda.linear import one_token_runs

    cols = 4096
    tensors = [
        random_tensor(q, r, cols, rng, name=f"blk.0.w{i}") for i, (q, r) in enumerate(zip(formats, rows, strict=True))
    ]
    biases = [rng.standard_normal(r).astype(np.float32) if i == 1 else None for i, r in enumerate(rows)]
    (gpu_w, cpu_w) = _load((cuda, cpu), tensors)
    gpu_fused = cuda.fuse_linear(gpu_w, [None if b is None else cuda.from_host(b) for b in biases])
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    got = cuda.to_host(cuda.linear(cuda.from_host(x), gpu_fused))
    ref = cpu.linear(x, cpu.fuse_linear(cpu_w, biases))
    assert got.shape == ref.shape and not np.isnan(got).any()
    if n_tok == 1:  # each run by its own kernel's bound
        start = 0
        kinds = [q not in ("F32", "BF16") for q in formats]
        for run in one_token_runs(kinds):
            part = slice(start, start + sum(rows[run.start : run.stop]))
            nbytes = sum(t.data.nbytes for t in tensors[run.start : run.stop])
            tol = linear_tol(1, cols, formats[run.start : run.stop], nbytes)
            assert rel_err(got[:, part], ref[:, part]) < tol, (run, formats)
            start = part.stop
    else:  # parts on the float32-x GEMVs, gemv_mma or cuBLAS on float16: the loosest bound
        assert rel_err(got, ref) < F16_TOL


@pytest.mark.parametrize("n_tok", [3, 9, 40])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("target", ["qkv", "gate_up"])
def test_norm_written_in_float16_for_the_dense_product(
    cuda, rng, target: str, with_residual: bool, n_tok: int
) -> None:
    """Above GEMV sizes, the norm kernel writes the normalized x in float16 for the product on the weights'
    float16 copy or on gemv_mma2: what the composition (float32 norm, a cast or gemv_mma2's pre-pass, the same
    product) gives."""
    from app.engine.backend.base import norm_then_product
    from app.engine.backend.cuda.backend import CudaBackend
    from app.engine.backend.cuda.linear import norm_half_linear

    dense = CudaBackend(dense_cache="on")
    cols, eps = 2048, 1e-6
    formats, rows = {"qkv": (("Q4_K", "Q4_K", "Q6_K"), (2048, 512, 512)), "gate_up": (("Q4_K", "Q4_K"), (1024, 1024))}[
        target
    ]
    tensors = [
        random_tensor(q, r, cols, rng, name=f"blk.0.w{i}") for i, (q, r) in enumerate(zip(formats, rows, strict=True))
    ]
    fused = dense.fuse_linear([dense.load_weight(t) for t in tensors], [None] * len(tensors))
    assert fused.dense16 is not None
    kind = None if target == "qkv" else "silu"
    x = dense.from_host(rng.standard_normal((n_tok, cols)).astype(np.float32))
    res = dense.from_host((rng.standard_normal((n_tok, cols)) * 4).astype(np.float32)) if with_residual else None
    nw = dense.from_host(rng.uniform(0.02, 0.05, cols).astype(np.float32))
    done = norm_half_linear(x, res, nw, eps, fused, kind, dense.gemv_plan)
    if done is None:  # gemv_mma.cu (v1) serves these tokens under this plan: the composition runs
        pytest.skip("the product runs on gemv_mma v1 here")
    got, new_res = done
    ref, ref_res = norm_then_product(dense, x, res, nw, eps, fused, kind)
    # the same float16 inputs to the same product: equal but for cuBLAS picking another summation order
    assert rel_err(dense.to_host(got), dense.to_host(ref)) < 1e-5
    np.testing.assert_array_equal(dense.to_host(new_res), dense.to_host(ref_res))


# (tokens, gate/up rows): 3 takes gemv_mma2 on gate/up (PADDOCK_GEMV_MMA_COPY_Q4_K) and down, which reads float16
# x too; 40 takes the norm in float16 and cuBLAS on the gate/up copy; 32 on a gate/up of MMA_TALL_ROWS takes
# gemv_mma2 there (PADDOCK_GEMV_MMA_COPY_TALL), after the norm in float16 as well
@pytest.mark.parametrize(("n_tok", "rows"), [(3, 1024), (40, 1024), (32, 16384)])
def test_gated_result_in_float16_for_a_down_product_on_its_float16_copy(cuda, rng, n_tok: int, rows: int) -> None:
    """Given the down weight (`then`) that reads float16 at these tokens, add_rms_norm_gated_linear writes its
    result in float16: the float32 result rounded as linear's cast would round it; linear takes it as it is and
    gives what it gives from the float32 result. Where down does not read float16, the result stays float32."""
    import cupy

    from app.engine.backend.cuda.backend import CudaBackend
    from app.engine.backend.cuda.linear import _mma_parts, takes_half
    from app.engine.kernels.gemv_plan import MMA_TALL_ROWS

    dense = CudaBackend(dense_cache="on")
    cols, eps = 2048, 1e-6
    gate_up = dense.fuse_linear(
        [dense.load_weight(random_tensor("Q4_K", rows, cols, rng, name=f"blk.0.ffn_{n}")) for n in ("gate", "up")],
        [None, None],
    )
    down = dense.load_weight(random_tensor("Q4_K", cols, rows, rng, name="blk.0.ffn_down"))
    x = dense.from_host(rng.standard_normal((n_tok, cols)).astype(np.float32))
    res = dense.from_host((rng.standard_normal((n_tok, cols)) * 4).astype(np.float32))
    nw = dense.from_host(rng.uniform(0.02, 0.05, cols).astype(np.float32))
    act, _ = dense.add_rms_norm_gated_linear(x, res, nw, eps, gate_up, "silu", then=down)
    act32, _ = dense.add_rms_norm_gated_linear(x, res, nw, eps, gate_up, "silu")
    plan = dense.gemv_plan
    on_mma = n_tok <= plan.mma_copy["Q4_K"] or (rows >= MMA_TALL_ROWS and n_tok <= plan.mma_copy_tall)
    assert (_mma_parts(n_tok, gate_up, plan) is not None) == on_mma
    half = takes_half(n_tok, down, dense.gemv_plan)
    # 32 and 40 tokens: cuBLAS on down's copy; 3: gemv_mma (PADDOCK_GEMV_MMA_COPY_Q4_K), float16 on gemv_mma2
    assert half == (n_tok > 16 or plan.mma_kernel == "v2")
    assert act.dtype == (cupy.float16 if half else cupy.float32) and act32.dtype == cupy.float32
    np.testing.assert_array_equal(dense.to_host(act), dense.to_host(act32).astype(act.dtype))
    got, ref = dense.to_host(dense.linear(act, down)), dense.to_host(dense.linear(act32, down))
    assert rel_err(got, ref) < 1e-6  # the same float16 x into the same product
    # float16 x where the product reads float32: linear widens it
    widened = dense.to_host(dense.linear(act32.astype(cupy.float16), down))
    assert rel_err(widened, dense.to_host(dense.linear(act32.astype(cupy.float16).astype(cupy.float32), down))) == 0


# 1: the fused launch (gemv_int.cu's norm prologue); 3: the norm in float16 for the float16 copy, or the composition
@pytest.mark.parametrize("n_tok", [1, 3])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("target", ["qkv", "gate_up", "qkv_gate"])
def test_add_rms_norm_then_product(cuda, cpu, rng, target: str, with_residual: bool, n_tok: int) -> None:
    """add_rms_norm_linear / add_rms_norm_gated_linear equal their compositions on the numpy
    backend; the new residual is x + residual exactly. "qkv_gate": four parts (q/k/v and an output
    gate), at one token two fused launches that each normalise x."""
    cols, eps = 2048, 1e-6
    formats, rows = {
        "qkv": (("Q4_K", "Q4_K", "Q6_K"), (2048, 512, 512)),
        "gate_up": (("Q4_K", "Q4_K"), (3072, 3072)),
        "qkv_gate": (("Q4_K", "Q4_K", "Q6_K", "Q4_K"), (2048, 512, 512, 2048)),
    }[target]
    tensors = [
        random_tensor(q, r, cols, rng, name=f"blk.0.w{i}") for i, (q, r) in enumerate(zip(formats, rows, strict=True))
    ]
    (gpu_w, cpu_w) = _load((cuda, cpu), tensors)
    gpu_fused = cuda.fuse_linear(gpu_w, [None] * len(tensors))
    cpu_fused = cpu.fuse_linear(cpu_w, [None] * len(tensors))
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    res = (rng.standard_normal((n_tok, cols)) * 4).astype(np.float32) if with_residual else None
    nw = rng.uniform(0.02, 0.05, cols).astype(np.float32)  # gate values ~ O(1)
    gpu_res = None if res is None else cuda.from_host(res)
    if target != "gate_up":
        got, new_res = cuda.add_rms_norm_linear(cuda.from_host(x), gpu_res, cuda.from_host(nw), eps, gpu_fused)
        ref, ref_res = cpu.add_rms_norm_linear(x, res, nw, eps, cpu_fused)
    else:
        got, new_res = cuda.add_rms_norm_gated_linear(
            cuda.from_host(x), gpu_res, cuda.from_host(nw), eps, gpu_fused, "silu"
        )
        ref, ref_res = cpu.add_rms_norm_gated_linear(x, res, nw, eps, cpu_fused, "silu")
    # 3 tokens: the norm kernel, then cuBLAS on the weights' float16 copy, or gemv_mma without one (float16 x and
    # weights either way)
    tol = INT_X_TOL if n_tok == 1 else F16_TOL
    assert rel_err(cuda.to_host(got), ref) < (GATED_FACTOR if target == "gate_up" else 1) * tol
    np.testing.assert_array_equal(cuda.to_host(new_res), ref_res)
