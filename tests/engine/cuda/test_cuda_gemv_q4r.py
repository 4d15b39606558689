"""gemv_q4r.cu (Q4_K and Q6_K repacked for the tensor cores) on the GPU: both layouts' packing and the product
against the float64 product of the numpy dequantizers' weights at every n-tile build, stacked weights (Q4_K beside
Q6_K in the byte layout), column splits reduced in a fixed order (the same bits run after run, counters left zero),
and `CudaBackend` routing products of the plan's token range to the repacked copies it makes at load (linear,
fused q/k/v, gate/up, the fused norm paths)."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import F16_TOL, dequantize_oracle, random_tensor, rel_err

pytestmark = pytest.mark.gpu


def _packed(cuda, rng, rows, cols, qtypes=None):
    from app.engine.kernels import gemv_q4r

    tensors = [random_tensor(q, r, cols, rng) for q, r in zip(qtypes or ["Q4_K"] * len(rows), rows, strict=True)]
    weights = [cuda.load_weight(t) for t in tensors]
    packed = gemv_q4r.pack([(w.data, t.qtype.name, w.row_bytes, w.n_rows) for w, t in zip(weights, tensors, strict=True)],
                           cols)
    ref_w = np.concatenate([dequantize_oracle(t) for t in tensors]).astype(np.float64)
    return packed, ref_w


@pytest.mark.parametrize("qtypes", [("Q4_K",) * 3, ("Q4_K", "Q4_K", "Q6_K"), ("Q6_K",) * 3])
@pytest.mark.parametrize("n_tok", [1, 2, 5, 8, 16, 17, 33, 64, 100, 128])
def test_gemv_q4r_matches_oracle(cuda, rng, n_tok: int, qtypes) -> None:
    import cupy

    from app.engine.kernels import gemv_q4r

    packed, ref_w = _packed(cuda, rng, (256, 64, 64), 4096, qtypes)  # q/k/v-like: few rows, many columns: splits
    assert packed.layout == gemv_q4r.layout_of(qtypes)
    x = rng.standard_normal((n_tok, 4096)).astype(np.float32)
    bias = rng.standard_normal(384).astype(np.float32)
    out = cupy.full((n_tok, 384), cupy.nan, cupy.float32)
    got = cupy.asnumpy(gemv_q4r.gemv_q4r(packed, cupy.asarray(x), out, cupy.asarray(bias)))
    ref = x.astype(np.float64) @ ref_w.T + bias
    assert gemv_q4r.pick_shape(n_tok, 384, 4096).splits > 1
    assert not np.isnan(got).any() and rel_err(got, ref) < F16_TOL


@pytest.mark.parametrize(("splits", "n_tok"), [(1, 24), (3, 9), (16, 128), (5, 1)])
def test_gemv_q4r_splits_are_exact_and_repeatable(cuda, rng, splits: int, n_tok: int) -> None:
    """Any number of splits: the same result, bit for bit, on every run, and the counters left zero."""
    import cupy

    from app.engine.kernels import gemv_q4r

    packed, ref_w = _packed(cuda, rng, (512, 512), 2048)
    x = cupy.asarray(rng.standard_normal((n_tok, 2048)).astype(np.float32))
    shape = gemv_q4r.pick_shape(n_tok, 1024, 2048)
    shape = gemv_q4r.Q4rShape(shape.m_tiles, shape.n_tiles, splits)
    runs = [cupy.asnumpy(gemv_q4r.gemv_q4r(packed, x, cupy.empty((n_tok, 1024), cupy.float32), shape=shape))
            for _ in range(3)]  # fmt: skip
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    assert rel_err(runs[0], cupy.asnumpy(x).astype(np.float64) @ ref_w.T) < F16_TOL
    assert not cupy.asnumpy(gemv_q4r._counters_for(1)).any()


def test_gemv_q4r_scales_span_a_wide_range(cuda, rng) -> None:
    """Rows of one 16-row tile whose scales differ by up to 2^20 (each row has its own factor): each row's
    products stay within float16's error of its own size."""
    import cupy

    from app.engine.kernels import gemv_q4r

    tensor = random_tensor("Q4_K", 64, 512, rng)
    blocks = tensor.data.reshape(64, 2, 144)
    for r in range(64):  # d and dmin of row r times 2^-(r % 21)
        for off in (0, 2):
            value = blocks[r, :, off : off + 2].copy().view(np.float16).astype(np.float32) * 2.0 ** -(r % 21)
            blocks[r, :, off : off + 2] = value.astype(np.float16).view(np.uint8).reshape(2, 2)
    weight = cuda.load_weight(tensor)
    packed = gemv_q4r.pack([(weight.data, "Q4_K", weight.row_bytes, 64)], 512)
    x = rng.standard_normal((4, 512)).astype(np.float32)
    got = cupy.asnumpy(gemv_q4r.gemv_q4r(packed, cupy.asarray(x), cupy.empty((4, 64), cupy.float32)))
    ref = x.astype(np.float64) @ dequantize_oracle(tensor).astype(np.float64).T
    for r in range(64):
        assert rel_err(got[:, r], ref[:, r]) < F16_TOL, f"row {r}"


@pytest.mark.parametrize("n_tok", [1, 9, 48])
def test_backend_routes_the_q4r_range(cuda, rng, n_tok: int) -> None:
    """With the q4r range set, Q4_K weights get repacked copies at load (fused parts stacked: one launch) and
    the plan's products go to them: linear, fused q/k/v, gate/up and the fused norm + product paths all
    equal the float64 composition; a Q6_K part takes its fused weight into the byte layout."""
    from app.engine.backend.cuda.backend import CudaBackend
    from app.engine.kernels import gemv_q4r
    from app.engine.kernels.options import KernelOptions

    backend = CudaBackend(kernel_options=KernelOptions(q4r_max_tokens=64, q4r_min_tokens=1))
    cols = 1024
    q, k, v = (random_tensor("Q4_K", r, cols, rng) for r in (256, 64, 64))
    gate, up = (random_tensor("Q4_K", 512, cols, rng) for _ in range(2))
    v6 = random_tensor("Q6_K", 64, cols, rng)
    qkv = backend.fuse_linear([backend.load_weight(t) for t in (q, k, v)], [None] * 3)
    gate_up = backend.fuse_linear([backend.load_weight(t) for t in (gate, up)], [None] * 2)
    mixed = backend.fuse_linear([backend.load_weight(t) for t in (q, k, v6)], [None] * 3)
    assert qkv.q4r is not None and qkv.q4r.n_rows == 384 and qkv.parts[1].q4r.n_rows == 64
    assert gate_up.q4r.interleaved and gate_up.parts[0].q4r is None  # the pair's tiles alternate
    assert mixed.q4r.layout == gemv_q4r.LAYOUT_BYTES and qkv.q4r.layout == gemv_q4r.LAYOUT_4BIT
    assert "repacked for gemv_q4r" in backend.dense_cache.summary()

    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    x64 = x.astype(np.float64)
    w = {name: dequantize_oracle(t).astype(np.float64) for name, t in
         (("q", q), ("k", k), ("v", v), ("gate", gate), ("up", up), ("v6", v6))}  # fmt: skip
    got = backend.to_host(backend.linear(backend.from_host(x), qkv))
    assert rel_err(got, x64 @ np.concatenate([w["q"], w["k"], w["v"]]).T) < F16_TOL
    got = backend.to_host(backend.linear(backend.from_host(x), qkv.parts[0]))
    assert rel_err(got, x64 @ w["q"].T) < F16_TOL
    got = backend.to_host(backend.linear(backend.from_host(x), mixed))
    assert rel_err(got, x64 @ np.concatenate([w["q"], w["k"], w["v6"]]).T) < F16_TOL

    got = backend.to_host(backend.linear(backend.from_host(x), gate_up))  # interleaved, written back in place
    assert rel_err(got, x64 @ np.concatenate([w["gate"], w["up"]]).T) < F16_TOL
    g, u = x64 @ w["gate"].T, x64 @ w["up"].T
    silu_ref = g / (1 + np.exp(-g)) * u
    got = backend.to_host(backend.gated_linear(backend.from_host(x), gate_up, "silu"))
    assert rel_err(got, silu_ref) < 2 * F16_TOL

    norm_w = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    residual = rng.standard_normal((n_tok, cols)).astype(np.float32)
    summed = x64 + residual
    normed = summed / np.sqrt((summed**2).mean(axis=1, keepdims=True) + 1e-6) * norm_w
    out, new_residual = backend.add_rms_norm_linear(
        backend.from_host(x), backend.from_host(residual), backend.from_host(norm_w), 1e-6, qkv
    )
    assert rel_err(backend.to_host(new_residual), summed) < 1e-6
    assert rel_err(backend.to_host(out), normed @ np.concatenate([w["q"], w["k"], w["v"]]).T) < F16_TOL

    out, _ = backend.add_rms_norm_gated_linear(
        backend.from_host(x), backend.from_host(residual), backend.from_host(norm_w), 1e-6, gate_up, "silu"
    )
    g, u = normed @ w["gate"].T, normed @ w["up"].T
    assert rel_err(backend.to_host(out), g / (1 + np.exp(-g)) * u) < 2 * F16_TOL


def test_engine_on_repacked_weights_matches_numpy(tiny_gguf: str, monkeypatch) -> None:
    """The whole engine with every projection of a Q4_K_M file repacked and every product of 1-128 tokens on
    gemv_q4r (prefill chunks, decode graphs of 12 sequences, the output head): greedy tokens and first-step
    logprobs as the numpy backend's."""
    from cuda_samples import assert_runs_agree

    from app.engine import envs
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.plan.shape import shape_from_checkpoint
    from app.engine.sampling_params import SamplingParams

    monkeypatch.setenv("PADDOCK_Q4R_MAX_TOKENS", "128")
    monkeypatch.setenv("PADDOCK_Q4R_MIN_TOKENS", "1")
    envs.reload()
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 256, size=n).tolist() for n in (3, 9, 17, 40, 77, 130, 5, 60, 33, 8, 21, 300)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    results = {}
    try:
        for device in ("cpu", "cuda"):
            engine = LLMEngine(EngineConfig(model=tiny_gguf, device=device, max_model_len=1024, max_num_seqs=16))
            if device == "cuda":  # the copies made are the ones the memory plan counts
                assert engine.backend.dense_cache.q4r_count > 0
                assert engine.backend.dense_cache.q4r_bytes == shape_from_checkpoint(tiny_gguf).repacked_bytes
            results[device] = engine.generate(prompts, params)
    finally:  # the switches' cached values go with the environment they came from
        monkeypatch.undo()
        envs.reload()
    assert_runs_agree(results["cuda"], results["cpu"], "q4r")
