"""How a kernel wrapper hands a paged KV cache to its kernel.

A float16 cache is one array per K or V, passed as it is. An FP8 cache (backend/fp8_kv.Fp8KvCache
holding device arrays: e4m3 codes `data` and per-(block, KV head) float32 `scale`) is passed as its
codes, with the kernel built with KV_FP8=1 and the K and V scales after the float16 build's arguments
(kernels/csrc/fp8_kv.cuh has the format).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class KvOperands(NamedTuple):
    defines: dict[str, int]  # the build's defines: {"KV_FP8": 1} for FP8 caches, else none
    k: Any  # the arrays the kernel reads or writes as its k_cache, v_cache
    v: Any
    scales: tuple[Any, ...]  # (k_scale, v_scale) for FP8 caches, else (): the kernel's trailing arguments


def is_fp8(cache: Any) -> bool:
    """Whether `cache` is an FP8 cache (codes and scales) rather than a plain float16 array."""
    return hasattr(cache, "scale") and hasattr(cache, "data")


def kv_operands(k_cache: Any, v_cache: Any) -> KvOperands:
    if is_fp8(k_cache) != is_fp8(v_cache):
        raise ValueError("K and V caches of different formats (one FP8, one not)")
    if is_fp8(k_cache):
        return KvOperands({"KV_FP8": 1}, k_cache.data, v_cache.data, (k_cache.scale, v_cache.scale))
    return KvOperands({}, k_cache, v_cache, ())
