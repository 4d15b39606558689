"""Wrapper of kv_cache.cu: new keys and values into the paged float16 cache."""

from __future__ import annotations

from typing import Any

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, i32, launch

THREADS = 256


def write_kv(k_cache: Any, v_cache: Any, k: Any, v: Any, slot_mapping: Any) -> None:
    n_tok = k.shape[0]
    row = k_cache.shape[2] * k_cache.shape[3]
    if k.shape[1] * k.shape[2] != row:
        raise ValueError(f"k of shape {k.shape} does not match cache rows of {k_cache.shape[2:]}")
    work = n_tok * row
    if work:
        launch(
            get_kernel("kv_cache.cu", "write_kv"),
            (cdiv(work, THREADS),),
            (THREADS,),
            (k, v, k_cache, v_cache, slot_mapping, i32(n_tok), i32(row)),
        )
