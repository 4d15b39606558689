"""The kernel wrappers hand FP8 caches to their kernels as kv_format.py says (no GPU needed: the
compile and launch calls are recorded): the same build and arguments as for float16 caches, but with
KV_FP8=1, the caches' codes in place of the float16 arrays and the K and V scales appended last.
The kernels themselves are checked on the emulator (tests/engine/cuda/test_emulated_*fp8*.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest

from app.engine.backend.fp8_kv import Fp8KvCache
from app.engine.kernels import attention, attention_decode, attention_prefill, kv_cache, kv_format, rope_cache

N_BLOCKS, BLOCK, N_KV, D, N_HEADS = 4, 16, 2, 128, 8


@pytest.fixture
def calls(monkeypatch) -> Iterator[list[tuple[str, dict, tuple]]]:
    """(kernel, defines, args) of every launch; numpy stands in for CuPy."""
    fake_cupy = SimpleNamespace(empty=np.empty, zeros=np.zeros, float32=np.float32, int32=np.int32,
                                cuda=SimpleNamespace(Device=lambda: SimpleNamespace(id=0)))  # fmt: skip
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    log: list[tuple[str, dict, tuple]] = []
    for module in (attention, attention_decode, attention_prefill, kv_cache, rope_cache):
        monkeypatch.setattr(module, "get_kernel", lambda name, kernel, defines=None: (kernel, dict(defines or {})))
        monkeypatch.setattr(module, "launch", lambda k, grid, block, args, **kw: log.append((k[0], k[1], tuple(args))))
    monkeypatch.setattr(attention_decode, "clusters_supported", lambda: False)
    monkeypatch.setattr(attention_prefill, "allow_shared", lambda *a: None)
    # a device where head dim 128 keeps the narrow tile for float16 caches too (the wide one is float16's only)
    monkeypatch.setattr(attention_prefill, "max_shared_bytes", lambda: 99 * 1024)
    attention_prefill.wide_tile.cache_clear()
    yield log
    attention_prefill.wide_tile.cache_clear()


def _caches():
    f16 = tuple(np.zeros((N_BLOCKS, BLOCK, N_KV, D), np.float16) for _ in range(2))
    fp8 = tuple(Fp8KvCache.zeros(N_BLOCKS, BLOCK, N_KV, D) for _ in range(2))
    return f16, fp8


def _run_all(k_cache, v_cache) -> None:
    q = np.zeros((2, N_HEADS, D), np.float32)
    lens, tables = np.array([5, 9], np.int32), np.zeros((2, 2), np.int32)
    qsl = np.array([0, 1, 2], np.int32)
    attention_decode.attention_decode(q, k_cache, v_cache, lens, tables, 0.1, None, None, 2, np.empty_like(q))
    attention_prefill.attention_prefill(q, k_cache, v_cache, qsl, lens, tables, 0.1, None, None, 1, np.empty_like(q))
    attention.attention(q, k_cache, v_cache, qsl, lens, tables, 0.1, None, None, attention.SplitPlan(1, 1 << 20),
                        np.empty_like(q))  # fmt: skip


def _same(a, b) -> bool:
    return a is b or (isinstance(a, np.generic) and isinstance(b, np.generic) and a == b)


def test_fp8_caches_reach_the_kernels_as_codes_then_scales(calls) -> None:
    f16, fp8 = _caches()
    _run_all(*f16)
    plain = list(calls)
    calls.clear()
    _run_all(*fp8)
    assert len(calls) == len(plain) == 3
    for (kernel, defines, args), (kernel16, defines16, args16) in zip(calls, plain, strict=True):
        assert kernel == kernel16
        assert defines == {**defines16, "KV_FP8": 1}
        assert len(args) == len(args16) + 2
        assert args[1] is fp8[0].data and args[2] is fp8[1].data
        assert args[-2] is fp8[0].scale and args[-1] is fp8[1].scale
        assert all(_same(a, b) for a, b in zip(args[3:-2], args16[3:], strict=True) if not isinstance(a, np.ndarray))


def test_mixed_cache_formats_are_refused() -> None:
    f16, fp8 = _caches()
    with pytest.raises(ValueError, match="different formats"):
        kv_format.kv_operands(f16[0], fp8[1])


def test_no_fused_rope_decode_over_fp8() -> None:
    _, fp8 = _caches()
    qkv = np.zeros((1, (N_HEADS + 2 * N_KV) * D), np.float32)
    cos = np.zeros((8, D // 2), np.float32)
    with pytest.raises(ValueError, match="no fused rope decode attention over FP8 caches"):
        attention_decode.attention_decode_qkv(
            qkv, N_HEADS, N_KV, D, None, None, 1e-6, np.zeros(1, np.int32), cos, cos, False, *fp8,
            np.zeros(1, np.int32), np.ones(1, np.int32), np.zeros((1, 1), np.int32), 0.1, None, None, 1,
            np.zeros((1, N_HEADS, D), np.float32),
        )  # fmt: skip


def test_rope_cache_over_fp8_stages_float32_rows_for_the_fp8_writer(calls) -> None:
    _, fp8 = _caches()
    n_tok = 3
    qkv = np.zeros((n_tok, (N_HEADS + 2 * N_KV) * D), np.float32)
    cos = np.zeros((8, D // 2), np.float32)
    slots = np.array([0, 1, -1], np.int32)
    rope_cache.rope_cache(qkv, N_HEADS, N_KV, D, None, None, 1e-6, np.zeros(n_tok, np.int32), cos, cos, False, *fp8,
                          slots, np.zeros((n_tok, N_HEADS, D), np.float32))  # fmt: skip
    (rope, rope_defines, rope_args), (write, write_defines, write_args) = calls
    assert (rope, rope_defines, write, write_defines) == ("rope_cache", {"KV_FP8": 1}, "write_kv_fp8", {"KV_FP8": 1})
    k_rows, v_rows = rope_args[-4], rope_args[-3]  # (..., k rows, v rows, slots, q_out)
    assert k_rows.shape == v_rows.shape == (n_tok, N_KV, D) and k_rows.dtype == np.float32
    assert write_args[:6] == (k_rows, v_rows, fp8[0].data, fp8[0].scale, fp8[1].data, fp8[1].scale)
    assert write_args[6] is slots
