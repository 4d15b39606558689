"""The numpy backend: the reference every other backend is tested against.

Everything is float32. Quantized weights are dequantized once, on first use, and kept
as float32 matrices (the file's bytes stay memory-mapped beside them): the CPU backend
trades memory for speed, the CUDA backend reads the quantized blocks directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata, RopeTable, norm_then_product, rope_cache_then_attention
from app.engine.quant.dispatch import QuantizedTensor

_GELU_C = np.float32(np.sqrt(2.0 / np.pi))
GEMV_ABOVE_BYTES = 64 << 20  # dense matrices above this go through gemv for few rows (see linear)
GEMV_MAX_ROWS = 16


class CpuWeight:
    """A checkpoint tensor plus its float32 values, dequantized on first use."""

    def __init__(self, tensor: QuantizedTensor) -> None:
        self.tensor = tensor
        self._dense: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor.shape

    @property
    def dense(self) -> np.ndarray:
        if self._dense is None:
            self._dense = np.ascontiguousarray(self.tensor.dequantize(), dtype=np.float32)
        return self._dense

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Selected rows without dequantizing the whole matrix (embedding lookups)."""
        if self._dense is not None:
            return self._dense[ids]
        return self.tensor.dequantize(rows=ids)


@dataclass(frozen=True)
class CpuFusedWeight:
    """Weights that multiply the same input, kept apart: `linear` runs them one by one."""

    parts: tuple[CpuWeight, ...]
    biases: tuple[np.ndarray | None, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])


class CpuBackend:
    name = "cpu"
    xp = np
    act_dtype = np.float32
    kv_dtype = np.float32

    # -- memory -------------------------------------------------------------------
    def from_host(self, array: np.ndarray, dtype: Any = None) -> np.ndarray:
        return np.asarray(array, dtype=dtype)

    def to_host(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def load_weight(self, tensor: QuantizedTensor) -> CpuWeight | np.ndarray:
        if len(tensor.shape) == 1:  # norms and biases: small, used as plain vectors
            return np.ascontiguousarray(tensor.dequantize(), dtype=np.float32)
        return CpuWeight(tensor)

    def alloc_kv_cache(self, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int):
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        return np.zeros(shape, np.float32), np.zeros(shape, np.float32)

    def rope_table(self, cos: np.ndarray, sin: np.ndarray) -> RopeTable:
        return RopeTable(np.asarray(cos, np.float32), np.asarray(sin, np.float32))

    # -- ops ----------------------------------------------------------------------
    def embedding(self, weight: CpuWeight, token_ids: np.ndarray) -> np.ndarray:
        return weight.rows(np.asarray(token_ids, dtype=np.int64)).astype(np.float32, copy=False)

    def linear(
        self, x: np.ndarray, weight: CpuWeight | CpuFusedWeight, bias: np.ndarray | None = None
    ) -> np.ndarray:
        if isinstance(weight, CpuFusedWeight):
            if bias is not None:
                raise ValueError("a fused weight carries its own biases")
            outs = [self.linear(x, w, b) for w, b in zip(weight.parts, weight.biases, strict=True)]
            return np.concatenate(outs, axis=-1)
        w = weight.dense
        if w.nbytes > GEMV_ABOVE_BYTES and x.shape[0] <= GEMV_MAX_ROWS:
            # A huge matrix (the vocabulary projection) with few rows: OpenBLAS's gemm re-packs the
            # whole matrix and streams it 3x slower than gemv (measured: 90 ms vs 27 ms for Gemma's
            # 262144 x 640 on 2 cores). Such rows always go through gemv, one by one, whatever the
            # batch, so each row's result stays the same alone or batched.
            out = np.stack([w @ row for row in x])
        elif x.shape[0] == 1:
            # A single row goes through BLAS gemv, whose summation order differs from gemm's;
            # doubling the row keeps one row's result identical whatever the batch (batch invariance).
            out = (np.concatenate([x, x]) @ w.T)[:1]
        else:
            out = x @ w.T
        if bias is not None:
            out += bias
        return out

    # -- fused ops: the reference compositions (base.py defines them as exactly these) ----

    def fuse_linear(
        self, weights: Sequence[CpuWeight], biases: Sequence[np.ndarray | None]
    ) -> CpuFusedWeight:
        if len(weights) != len(biases) or not weights:
            raise ValueError("fuse_linear takes one bias (or None) per weight")
        if any(w.shape[1] != weights[0].shape[1] for w in weights):
            raise ValueError(f"fused weights must share their input width: {[w.shape for w in weights]}")
        return CpuFusedWeight(tuple(weights), tuple(biases))

    def gated_linear(self, x: np.ndarray, gate_up: CpuFusedWeight, kind: str) -> np.ndarray:
        (gate, up), (gate_bias, up_bias) = gate_up.parts, gate_up.biases
        return self.gated_activation(self.linear(x, gate, gate_bias), self.linear(x, up, up_bias), kind)

    def rope_cache_attention(self, qkv, rope, k_cache, v_cache, meta, scale, sliding_window=None, softcap=None):
        return rope_cache_then_attention(self, qkv, rope, k_cache, v_cache, meta, scale, sliding_window, softcap)

    def add_rms_norm_linear(self, x, residual, norm_weight, eps: float, weight):
        return norm_then_product(self, x, residual, norm_weight, eps, weight, None)

    def add_rms_norm_gated_linear(self, x, residual, norm_weight, eps: float, gate_up: CpuFusedWeight, kind: str):
        return norm_then_product(self, x, residual, norm_weight, eps, gate_up, kind)

    def rope_and_cache(
        self,
        qkv: np.ndarray,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        q_norm: np.ndarray | None,
        k_norm: np.ndarray | None,
        eps: float,
        positions: np.ndarray,
        table: RopeTable,
        interleaved: bool,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        slot_mapping: np.ndarray,
    ) -> np.ndarray:
        n_tok = qkv.shape[0]
        q_cols, kv_cols = n_heads * head_dim, n_kv_heads * head_dim
        q = qkv[:, :q_cols].reshape(n_tok, n_heads, head_dim)
        k = qkv[:, q_cols : q_cols + kv_cols].reshape(n_tok, n_kv_heads, head_dim)
        v = qkv[:, q_cols + kv_cols : q_cols + 2 * kv_cols].reshape(n_tok, n_kv_heads, head_dim)
        if q_norm is not None:
            q, k = self.rms_norm(q, q_norm, eps), self.rms_norm(k, k_norm, eps)
        q = self.rope(q, positions, table, interleaved)
        k = self.rope(k, positions, table, interleaved)
        self.write_kv(k_cache, v_cache, k, v, slot_mapping)
        return q

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        variance = np.mean(np.square(x), axis=-1, keepdims=True)
        return (x / np.sqrt(variance + np.float32(eps))) * weight

    def add_rms_norm(self, x: np.ndarray, residual: np.ndarray, weight: np.ndarray, eps: float):
        new_residual = residual + x
        return self.rms_norm(new_residual, weight, eps), new_residual

    def rope(self, x: np.ndarray, positions: np.ndarray, table: RopeTable, interleaved: bool) -> np.ndarray:
        cos = table.cos[positions][:, None, :]  # [T, 1, d/2]
        sin = table.sin[positions][:, None, :]
        if interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]
        else:
            half = x.shape[-1] // 2
            x1, x2 = x[..., :half], x[..., half:]
        r1 = x1 * cos - x2 * sin
        r2 = x2 * cos + x1 * sin
        if interleaved:
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = r1, r2
            return out
        return np.concatenate([r1, r2], axis=-1)

    def gated_activation(self, gate: np.ndarray, up: np.ndarray, kind: str) -> np.ndarray:
        if kind == "silu":
            return gate / (np.float32(1.0) + np.exp(-gate)) * up
        if kind == "gelu_tanh":
            inner = _GELU_C * (gate + np.float32(0.044715) * gate * gate * gate)
            return np.float32(0.5) * gate * (np.float32(1.0) + np.tanh(inner)) * up
        raise ValueError(f"unknown activation {kind!r}; expected 'silu' or 'gelu_tanh'")

    def write_kv(self, k_cache, v_cache, k, v, slot_mapping) -> None:
        block_size = k_cache.shape[1]
        blocks, offsets = np.divmod(np.asarray(slot_mapping, dtype=np.int64), block_size)
        k_cache[blocks, offsets] = k
        v_cache[blocks, offsets] = v

    def attention(
        self,
        q: np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> np.ndarray:
        n_heads, head_dim = q.shape[1], q.shape[2]
        n_kv = k_cache.shape[2]
        group = n_heads // n_kv
        block_size = k_cache.shape[1]
        starts = meta.host_query_start_loc if meta.host_query_start_loc is not None else meta.query_start_loc
        seq_lens = meta.host_seq_lens if meta.host_seq_lens is not None else meta.seq_lens
        out = np.empty_like(q)
        for i in range(len(seq_lens)):
            q_start, q_end, ctx = int(starts[i]), int(starts[i + 1]), int(seq_lens[i])
            n_q = q_end - q_start
            n_blocks = -(-ctx // block_size)
            table = meta.block_tables[i, :n_blocks]
            keys = k_cache[table].reshape(-1, n_kv, head_dim)[:ctx]  # [ctx, n_kv, d]
            values = v_cache[table].reshape(-1, n_kv, head_dim)[:ctx]
            # [n_kv, group * n_q, d]: the query heads that share one KV head, stacked as rows
            qs = q[q_start:q_end].reshape(n_q, n_kv, group, head_dim).transpose(1, 2, 0, 3)
            qs = qs.reshape(n_kv, group * n_q, head_dim)
            scores = np.matmul(qs, keys.transpose(1, 2, 0)) * np.float32(scale)  # [n_kv, group*n_q, ctx]
            if softcap is not None:
                scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
            q_pos = np.arange(ctx - n_q, ctx)
            k_pos = np.arange(ctx)
            visible = k_pos[None, :] <= q_pos[:, None]
            if sliding_window is not None:
                visible &= k_pos[None, :] > q_pos[:, None] - sliding_window
            mask = np.tile(visible, (group, 1))  # rows ordered (group, n_q)
            scores = np.where(mask[None], scores, np.float32(-np.inf))
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            ctx_out = np.matmul(probs, values.transpose(1, 0, 2))  # [n_kv, group*n_q, d]
            ctx_out = ctx_out.reshape(n_kv, group, n_q, head_dim).transpose(2, 0, 1, 3)
            out[q_start:q_end] = ctx_out.reshape(n_q, n_heads, head_dim)
        return out

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        return np.float32(cap) * np.tanh(x / np.float32(cap))
