"""Norms, RoPE, activations, the attention output gate, soft cap and the KV write against the numpy backend."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import rel_err

pytestmark = pytest.mark.gpu

TOL = 2e-6  # the same float32 formula, evaluated in another order


@pytest.mark.parametrize("shape", [(1, 4096), (7, 1024), (3, 640), (5, 8, 128), (2, 3, 256), (1, 1, 100)])
def test_rms_norm(cuda, cpu, rng, shape: tuple[int, ...]) -> None:
    x = rng.standard_normal(shape).astype(np.float32) * 3
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    got = cuda.to_host(cuda.rms_norm(cuda.from_host(x), cuda.from_host(w), 1e-6))
    assert rel_err(got, cpu.rms_norm(x, w, 1e-6)) < TOL


@pytest.mark.parametrize("shape", [(1, 4096), (9, 2560), (4, 1000)])
def test_add_rms_norm(cuda, cpu, rng, shape: tuple[int, int]) -> None:
    x, res = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    normed, new_res = cuda.add_rms_norm(cuda.from_host(x), cuda.from_host(res), cuda.from_host(w), 1e-5)
    ref_normed, ref_res = cpu.add_rms_norm(x, res, w, 1e-5)
    assert rel_err(cuda.to_host(normed), ref_normed) < TOL
    np.testing.assert_array_equal(cuda.to_host(new_res), ref_res)


@pytest.mark.parametrize(("shape", "scaled"), [((1, 5376), True), ((7, 2816), False), ((3, 1002), True)])
def test_rms_norm_join(cuda, cpu, rng, shape: tuple[int, int], scaled: bool) -> None:
    """(norm(x) + stream) * scale in one launch, and the three ops where the rows are no float4s (1002)."""
    x, stream = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    scale = np.array([0.37], np.float32) if scaled else None
    got = cuda.rms_norm_join(cuda.from_host(x), cuda.from_host(w), 1e-6, cuda.from_host(stream),
                             None if scale is None else cuda.from_host(scale))  # fmt: skip
    assert rel_err(cuda.to_host(got), cpu.rms_norm_join(x, w, 1e-6, stream, scale)) < TOL


@pytest.mark.parametrize("shape", [(1, 2816), (6, 5376), (2, 1002)])
def test_rms_norm_pair(cuda, cpu, rng, shape: tuple[int, int]) -> None:
    """One norm under two weights in one launch, and the two norms where the rows are no float4s (1002)."""
    x = rng.standard_normal(shape).astype(np.float32)
    w, w2 = np.ones(shape[-1], np.float32), rng.standard_normal(shape[-1]).astype(np.float32)
    got = cuda.rms_norm_pair(cuda.from_host(x), cuda.from_host(w), cuda.from_host(w2), 1e-6)
    for g, r in zip(got, cpu.rms_norm_pair(x, w, w2, 1e-6), strict=True):
        assert rel_err(cuda.to_host(g), r) < TOL


@pytest.mark.parametrize(("tokens", "start", "heads", "cols"), [(1, 12288, 16, 256), (5, 4096, 2, 512), (2, 6, 3, 10)])
def test_rms_norm_heads(cuda, cpu, rng, tokens: int, start: int, heads: int, cols: int) -> None:
    """Value heads normalised in the q/k/v rows: in place on the float4 kernel, copied where it does not serve
    (10 columns, start 6)."""
    x = rng.standard_normal((tokens, start + heads * cols + 4)).astype(np.float32)
    w = np.ones(cols, np.float32)
    got = cuda.to_host(cuda.rms_norm_heads(cuda.from_host(x), start, heads, cuda.from_host(w), 1e-6))
    assert rel_err(got, cpu.rms_norm_heads(x, start, heads, w, 1e-6)) < TOL


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize(("n_tok", "n_heads", "head_dim"), [(1, 32, 128), (13, 4, 256), (6, 3, 64)])
def test_rope(cuda, cpu, rng, interleaved: bool, n_tok: int, n_heads: int, head_dim: int) -> None:
    max_pos = 4096
    inv = 1.0 / (10000.0 ** (np.arange(0, head_dim, 2) / head_dim))
    angles = np.arange(max_pos)[:, None] * inv[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    x = rng.standard_normal((n_tok, n_heads, head_dim)).astype(np.float32)
    pos = rng.integers(0, max_pos, n_tok).astype(np.int32)
    got = cuda.rope(cuda.from_host(x), cuda.from_host(pos), cuda.rope_table(cos, sin), interleaved)
    ref = cpu.rope(x, pos, cpu.rope_table(cos, sin), interleaved)
    assert rel_err(cuda.to_host(got), ref) < TOL


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("shape", [(1, 12288), (7, 1001)])
def test_gated_activation(cuda, cpu, rng, kind: str, shape: tuple[int, int]) -> None:
    gate = rng.standard_normal(shape).astype(np.float32) * 4
    up = rng.standard_normal(shape).astype(np.float32)
    got = cuda.gated_activation(cuda.from_host(gate), cuda.from_host(up), kind)
    assert rel_err(cuda.to_host(got), cpu.gated_activation(gate, up, kind)) < TOL


def test_gated_activation_rejects_unknown_kind(cuda) -> None:
    z = cuda.from_host(np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError, match="relu"):
        cuda.gated_activation(z, z, "relu")


@pytest.mark.parametrize("cap", [30.0, 50.0])
def test_softcap(cuda, cpu, rng, cap: float) -> None:
    x = rng.standard_normal((5, 3001)).astype(np.float32) * 60
    got = cuda.to_host(cuda.softcap(cuda.from_host(x), cap))
    assert rel_err(got, cpu.softcap(x, cap)) < TOL


@pytest.mark.parametrize("kind", ["sigmoid", "softplus"])
@pytest.mark.parametrize(("n_tok", "per_head"), [(1, False), (32, False), (5, True)])
def test_output_gate(cuda, cpu, rng, kind: str, n_tok: int, per_head: bool) -> None:
    """The attention output gate in one launch, its gate read in place from the fused product's last columns."""
    heads, head_dim = 8, 256
    width = heads * head_dim
    fused = (rng.standard_normal((n_tok, 2 * width + (heads if per_head else width))) * 4).astype(np.float32)
    out = rng.standard_normal((n_tok, width)).astype(np.float32)
    gpu_fused = cuda.from_host(fused)
    got = cuda.to_host(cuda.output_gate(cuda.from_host(out), gpu_fused[:, 2 * width :], kind))
    assert rel_err(got, cpu.output_gate(out, fused[:, 2 * width :], kind)) < TOL


def test_output_gate_rejects_a_mismatched_gate(cuda) -> None:
    z = cuda.from_host(np.zeros((2, 12), np.float32))
    with pytest.raises(ValueError, match="does not gate"):
        cuda.output_gate(z, cuda.from_host(np.zeros((2, 5), np.float32)), "sigmoid")
    with pytest.raises(ValueError, match="relu"):
        cuda.output_gate(z, z, "relu")


@pytest.mark.parametrize(("n_kv", "head_dim"), [(8, 128), (1, 256), (2, 64)])
def test_write_kv(cuda, rng, n_kv: int, head_dim: int) -> None:
    num_blocks, block_size, n_tok = 9, 16, 21
    k_cache, v_cache = cuda.alloc_kv_cache(num_blocks, block_size, n_kv, head_dim)
    before_k = rng.standard_normal(k_cache.shape).astype(np.float16)
    k_cache[...] = cuda.from_host(before_k)
    slots = rng.choice(num_blocks * block_size, n_tok, replace=False).astype(np.int32)
    slots[-1] = -1  # padding token: nothing written
    k = rng.standard_normal((n_tok, n_kv, head_dim)).astype(np.float32)
    v = rng.standard_normal((n_tok, n_kv, head_dim)).astype(np.float32)
    cuda.write_kv(k_cache, v_cache, cuda.from_host(k), cuda.from_host(v), cuda.from_host(slots))
    got_k = cuda.to_host(k_cache).reshape(-1, n_kv, head_dim)
    got_v = cuda.to_host(v_cache).reshape(-1, n_kv, head_dim)
    np.testing.assert_array_equal(got_k[slots[:-1]], k[:-1].astype(np.float16))
    np.testing.assert_array_equal(got_v[slots[:-1]], v[:-1].astype(np.float16))
    untouched = np.setdiff1d(np.arange(num_blocks * block_size), slots[:-1])
    np.testing.assert_array_equal(got_k[untouched], before_k.reshape(-1, n_kv, head_dim)[untouched])
