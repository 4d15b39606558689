"""Wrapper of rope.cu: rotary embedding, interleaved (GGUF) or NeoX (HF) pairs, of the whole head or
(partial RoPE) of its first `2 * cos.shape[1]` dims."""

from __future__ import annotations

from typing import Any

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, i32, launch

THREADS = 256


def rope(x: Any, positions: Any, cos: Any, sin: Any, interleaved: bool, out: Any) -> Any:
    n_tok, n_heads, head_dim = x.shape
    if cos.shape[1] * 2 > head_dim or head_dim % 2:
        raise ValueError(
            f"rope table has {cos.shape[1]} frequencies; head_dim {head_dim} takes at most {head_dim // 2}"
        )
    work = n_tok * n_heads * (head_dim // 2)
    if work:
        launch(
            get_kernel("rope.cu", "rope"),
            (cdiv(work, THREADS),),
            (THREADS,),
            (
                x,
                positions,
                cos,
                sin,
                out,
                i32(n_tok),
                i32(n_heads),
                i32(head_dim),
                i32(cos.shape[0]),
                i32(cos.shape[1]),  # fewer than head_dim / 2: partial RoPE
                i32(interleaved),
            ),
        )
    return out
