"""The numpy backend's fused ops equal the unfused compositions base.py defines them as, bit for bit.

The CUDA backend implements the same ops as single kernels and is checked against these
in tests/engine/cuda/test_cuda_fused.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.backend.cpu import CpuBackend
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.reference import random_blocks
from app.engine.quant.types import QUANT_TYPES


def _weight(cpu: CpuBackend, qtype: str, rows: int, cols: int, rng: np.random.Generator):
    q = QUANT_TYPES[qtype]
    blocks = random_blocks(q, rows * cols // q.block_size, rng, scale=cols**-0.5)
    return cpu.load_weight(QuantizedTensor(f"w{rows}", q, (rows, cols), blocks.reshape(rows, -1)))


@pytest.fixture
def cpu() -> CpuBackend:
    return CpuBackend()


@pytest.mark.parametrize("n_tok", [1, 2, 7])
def test_fused_linear_is_the_concatenation(cpu: CpuBackend, n_tok: int) -> None:
    rng = np.random.default_rng(n_tok)
    parts = [
        _weight(cpu, "Q4_K", 64, 256, rng),
        _weight(cpu, "Q4_K", 32, 256, rng),
        _weight(cpu, "Q6_K", 32, 256, rng),
    ]
    biases = [rng.standard_normal(64).astype(np.float32), None, rng.standard_normal(32).astype(np.float32)]
    x = rng.standard_normal((n_tok, 256)).astype(np.float32)
    fused = cpu.fuse_linear(parts, biases)
    assert fused.shape == (128, 256)
    expected = np.concatenate([cpu.linear(x, w, b) for w, b in zip(parts, biases, strict=True)], axis=-1)
    np.testing.assert_array_equal(cpu.linear(x, fused), expected)


def test_fused_linear_rejects_mismatched_parts(cpu: CpuBackend) -> None:
    rng = np.random.default_rng(0)
    a, b = _weight(cpu, "Q8_0", 8, 64, rng), _weight(cpu, "Q8_0", 8, 96, rng)
    with pytest.raises(ValueError, match="input width"):
        cpu.fuse_linear([a, b], [None, None])
    with pytest.raises(ValueError, match="one bias"):
        cpu.fuse_linear([a], [None, None])


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("n_tok", [1, 5])
def test_gated_linear_is_activation_of_two_linears(cpu: CpuBackend, kind: str, n_tok: int) -> None:
    rng = np.random.default_rng(11 + n_tok)
    gate, up = _weight(cpu, "Q4_K", 96, 512, rng), _weight(cpu, "Q5_0", 96, 512, rng)
    x = rng.standard_normal((n_tok, 512)).astype(np.float32)
    expected = cpu.gated_activation(cpu.linear(x, gate), cpu.linear(x, up), kind)
    got = cpu.gated_linear(x, cpu.fuse_linear([gate, up], [None, None]), kind)
    np.testing.assert_array_equal(got, expected)


def _rope_table(cpu: CpuBackend, head_dim: int, max_pos: int = 512):
    inv = 1.0 / (10000.0 ** (np.arange(0, head_dim, 2) / head_dim))
    angles = np.arange(max_pos)[:, None] * inv[None, :]
    return cpu.rope_table(np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32))


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("n_tok", [1, 6])
def test_rope_and_cache_is_norm_rope_and_write(
    cpu: CpuBackend, interleaved: bool, qk_norm: bool, n_tok: int
) -> None:
    rng = np.random.default_rng(n_tok * 4 + 2 * qk_norm + interleaved)
    n_heads, n_kv, d, block = 4, 2, 64, 16
    table = _rope_table(cpu, d)
    qkv = rng.standard_normal((n_tok, (n_heads + 2 * n_kv) * d)).astype(np.float32)
    positions = rng.integers(0, 512, n_tok).astype(np.int32)
    slots = rng.choice(8 * block, n_tok, replace=False).astype(np.int32)
    q_norm = rng.standard_normal(d).astype(np.float32) if qk_norm else None
    k_norm = rng.standard_normal(d).astype(np.float32) if qk_norm else None
    caches = [cpu.alloc_kv_cache(8, block, n_kv, d) for _ in range(2)]

    got = cpu.rope_and_cache(
        qkv, n_heads, n_kv, d, q_norm, k_norm, 1e-6, positions, table, interleaved, *caches[0], slots
    )

    q = qkv[:, : n_heads * d].reshape(n_tok, n_heads, d)
    k = qkv[:, n_heads * d : (n_heads + n_kv) * d].reshape(n_tok, n_kv, d)
    v = qkv[:, (n_heads + n_kv) * d :].reshape(n_tok, n_kv, d)
    if qk_norm:
        q, k = cpu.rms_norm(q, q_norm, 1e-6), cpu.rms_norm(k, k_norm, 1e-6)
    q, k = cpu.rope(q, positions, table, interleaved), cpu.rope(k, positions, table, interleaved)
    cpu.write_kv(*caches[1], k, v, slots)
    np.testing.assert_array_equal(got, q)
    np.testing.assert_array_equal(caches[0][0], caches[1][0])
    np.testing.assert_array_equal(caches[0][1], caches[1][1])
