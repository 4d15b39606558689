"""The numpy backend: the reference every other backend is tested against.

Everything is float32. Quantized weights are dequantized once, on first use, and kept
as float32 matrices (the file's bytes stay memory-mapped beside them): the CPU backend
trades memory for speed, the CUDA backend reads the quantized blocks directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from app.engine.backend import kv_blocks, recurrent_reference
from app.engine.backend.base import (
    AttentionMetadata,
    RopeTable,
    norm_each_head,
    norm_rope_then_cache,
    norm_then_join,
    norm_then_product,
    rope_cache_then_attention,
)
from app.engine.backend.cpu_experts import CpuStreamedExperts
from app.engine.backend.cpu_weights import CpuFusedWeight, CpuWeight
from app.engine.backend.fp8_kv import Fp8KvCache
from app.engine.backend.reference_attention import paged_attention
from app.engine.backend.ssd_reference import gated_group_rms_norm, softplus, ssd_scan
from app.engine.quant.dispatch import QuantizedTensor

if TYPE_CHECKING:
    from app.engine.moe.residency import ExpertStreaming
    from app.engine.specs import GatedDeltaNetSpec, MoeSpec

_GELU_C = np.float32(np.sqrt(2.0 / np.pi))
GEMV_ABOVE_BYTES = 64 << 20  # dense matrices above this go through gemv for few rows (see linear)
GEMV_MAX_ROWS = 16


KV_NUMPY_DTYPES = {"auto": np.float32, "float32": np.float32, "float16": np.float16}


class CpuBackend:
    name = "cpu"
    supports_attention_sinks = True  # `attention(..., sinks=)` (GPT-OSS)
    supports_partial_rope = True  # rope tables narrower than the head turn its first dims only
    xp = np
    act_dtype = np.float32
    kv_dtype = np.float32
    # set by the engine for `--experts-on-gpu N`: MoE layers then keep N experts per layer in
    # "device" slots and copy the rest in per step, as the CUDA backend streams them (see moe)
    expert_streaming: ExpertStreaming | None = None

    # -- memory -------------------------------------------------------------------
    def from_host(self, array: np.ndarray, dtype: Any = None) -> np.ndarray:
        return np.asarray(array, dtype=dtype)

    def to_host(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def load_weight(self, tensor: QuantizedTensor) -> CpuWeight | np.ndarray:
        if len(tensor.shape) == 1:  # norms and biases: small, used as plain vectors
            return np.ascontiguousarray(tensor.dequantize(), dtype=np.float32)
        return CpuWeight(tensor)

    def alloc_kv_cache(self, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, dtype: str = "auto"):
        """`dtype`: "auto" or "float32", "float16" (numpy half) or "fp8" (fp8_kv.Fp8KvCache)."""
        if dtype == "fp8":
            return tuple(Fp8KvCache.zeros(num_blocks, block_size, n_kv_heads, head_dim) for _ in range(2))
        if dtype not in KV_NUMPY_DTYPES:
            raise ValueError(f"unknown KV dtype {dtype!r}; choose auto, float32, float16 or fp8")
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        return np.zeros(shape, KV_NUMPY_DTYPES[dtype]), np.zeros(shape, KV_NUMPY_DTYPES[dtype])

    # -- whole KV blocks, for the offload tiers (backend/kv_blocks.py) ------------------
    def alloc_host_blocks(self, num_blocks: int, block_nbytes: int) -> np.ndarray:
        """Host memory for `num_blocks` block payloads (CUDA: pinned)."""
        return np.zeros((num_blocks, block_nbytes), np.uint8)

    def read_kv_blocks(self, kv_caches: list, block_ids: Sequence[int], out: Sequence[np.ndarray]) -> None:
        """Copy the blocks' payloads into host rows `out` (`[len(block_ids), block_nbytes]`, or that many rows)."""
        ids = np.asarray(block_ids, dtype=np.int64)
        kv_blocks.gather_into_rows(kv_caches, ids, kv_blocks.host_rows(out, len(ids), kv_blocks.block_nbytes(kv_caches)))

    def write_kv_blocks(self, kv_caches: list, block_ids: Sequence[int], src: Sequence[np.ndarray]) -> None:
        """Copy host payload rows `src` (as `out` above) into the blocks."""
        ids = np.asarray(block_ids, dtype=np.int64)
        kv_blocks.scatter_from_rows(kv_caches, ids, kv_blocks.host_rows(src, len(ids), kv_blocks.block_nbytes(kv_caches)))

    def sync_kv_copies(self) -> None:
        """Wait for block copies in flight (numpy copies synchronously)."""

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

    def gated_linear(self, x: np.ndarray, gate_up: CpuFusedWeight, kind: str, then=None) -> np.ndarray:
        (gate, up), (gate_bias, up_bias) = gate_up.parts, gate_up.biases
        return self.gated_activation(self.linear(x, gate, gate_bias), self.linear(x, up, up_bias), kind)

    def rope_cache_attention(
        self, qkv, rope, k_cache, v_cache, meta, scale, sliding_window=None, softcap=None, then=None
    ):
        return rope_cache_then_attention(
            self, qkv, rope, k_cache, v_cache, meta, scale, sliding_window, softcap
        )

    def add_rms_norm_linear(self, x, residual, norm_weight, eps: float, weight):
        return norm_then_product(self, x, residual, norm_weight, eps, weight, None)

    def add_rms_norm_gated_linear(
        self, x, residual, norm_weight, eps: float, gate_up: CpuFusedWeight, kind: str, then=None
    ):
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
        return norm_rope_then_cache(
            self, qkv, n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps, positions, table, interleaved,
            k_cache, v_cache, slot_mapping,
        )  # fmt: skip

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        variance = np.mean(np.square(x), axis=-1, keepdims=True)
        return (x / np.sqrt(variance + np.float32(eps))) * weight

    def add_rms_norm(self, x: np.ndarray, residual: np.ndarray, weight: np.ndarray, eps: float):
        new_residual = residual + x
        return self.rms_norm(new_residual, weight, eps), new_residual

    def rms_norm_join(
        self, x: np.ndarray, weight: np.ndarray, eps: float, join: np.ndarray, scale: np.ndarray | None = None
    ) -> np.ndarray:
        return norm_then_join(self, x, weight, eps, join, scale)

    def rms_norm_pair(
        self, x: np.ndarray, weight: np.ndarray, weight2: np.ndarray, eps: float
    ) -> tuple[np.ndarray, np.ndarray]:
        return self.rms_norm(x, weight, eps), self.rms_norm(x, weight2, eps)

    def rms_norm_heads(self, x: np.ndarray, start: int, heads: int, weight: np.ndarray, eps: float) -> np.ndarray:
        return norm_each_head(self, x, start, heads, weight, eps)

    def rope(self, x: np.ndarray, positions: np.ndarray, table: RopeTable, interleaved: bool) -> np.ndarray:
        rotary = 2 * table.cos.shape[-1]
        if rotary < x.shape[-1]:  # partial RoPE (Qwen3.5, Qwen3-Next): the first `rotary` dims turn
            turned = self.rope(x[..., :rotary], positions, table, interleaved)
            return np.concatenate([turned, x[..., rotary:]], axis=-1)
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
            with np.errstate(over="ignore"):  # exp(-g) is inf below g = -88: g / inf is silu's limit there, -0
                return gate / (np.float32(1.0) + np.exp(-gate)) * up
        if kind == "gelu_tanh":
            inner = _GELU_C * (gate + np.float32(0.044715) * gate * gate * gate)
            return np.float32(0.5) * gate * (np.float32(1.0) + np.tanh(inner)) * up
        raise ValueError(f"unknown activation {kind!r}; expected 'silu' or 'gelu_tanh'")

    def write_kv(self, k_cache, v_cache, k, v, slot_mapping) -> None:
        if isinstance(k_cache, Fp8KvCache):
            k_cache.write(k, slot_mapping)
            v_cache.write(v, slot_mapping)
            return
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
        sinks: np.ndarray | None = None,
    ) -> np.ndarray:
        return paged_attention(np, q, k_cache, v_cache, meta, scale, sliding_window, softcap, sinks=sinks)

    # -- mixture of experts streamed from host RAM (only with expert_streaming set) ---------
    def load_experts(
        self,
        spec: MoeSpec,
        weights: Sequence[Sequence[QuantizedTensor]],
        biases: Sequence[Sequence[QuantizedTensor | None]],
    ) -> CpuStreamedExperts | None:
        """None (the layer's own per-expert loop) unless experts are streamed; then the layer's slots."""
        if self.expert_streaming is None or len(weights) == 2:  # ungated experts: never streamed
            return None
        per_expert = sum(ws[0].data.nbytes for ws in weights)  # what a copy moves: the file's blocks
        residency = self.expert_streaming.layer(spec.num_experts, spec.num_used, per_expert)
        return CpuStreamedExperts(weights, biases, residency)

    def moe(
        self, x: np.ndarray, router_logits: np.ndarray, spec: MoeSpec, experts: CpuStreamedExperts, score_bias=None
    ) -> np.ndarray:
        """The layer's experts' weighted sum, each expert read from the slot the residency manager
        put it in, its copies made just before its round: the same ops in the same order as the
        all-resident loop (layers/moe.py), so the same values."""
        from app.engine.moe.ops import expert_forward, route, sum_over_experts

        weights, chosen = route(np, router_logits, spec, score_bias)
        rounds = experts.residency.step(chosen)
        slot_of = {e: s for r in rounds for e, s in zip(r.experts, r.slots, strict=True)}
        starts = {r.experts[0]: r.copies for r in rounds if r.experts}
        experts.fetch([c for r in rounds if not r.experts for c in r.copies])  # a rebalance alone

        def run(expert: int, rows: np.ndarray) -> np.ndarray:
            experts.fetch(starts.get(expert, ()))
            slot = slot_of[expert]
            return expert_forward(self, spec, experts.gate_up[slot], experts.down[slot], experts.down_biases[slot], rows)

        return sum_over_experts(self, x, weights, chosen, spec, run)

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        return np.float32(cap) * np.tanh(x / np.float32(cap))

    def output_gate(self, out: np.ndarray, gate: np.ndarray, kind: str) -> np.ndarray:
        if kind == "sigmoid":
            one = gate.dtype.type(1.0)
            factor = one / (one + np.exp(-gate))
        elif kind == "softplus":
            factor = np.logaddexp(gate.dtype.type(0.0), gate)
        else:
            raise ValueError(f"unknown output gate {kind!r}; expected sigmoid or softplus")
        factor = factor.astype(out.dtype, copy=False)
        if gate.shape[1] == out.shape[1]:
            return out * factor
        heads = out.reshape(out.shape[0], gate.shape[1], -1) * factor[:, :, None]
        return heads.reshape(out.shape)

    # -- recurrent layers: the references, as they are (recurrent_reference.py, ssd_reference.py) -------
    recurrent_syncs_host = True  # they walk the batch's sequences on the host

    def causal_conv1d(self, x, weight, bias, conv_state, meta: AttentionMetadata, silu: bool = True) -> np.ndarray:
        return recurrent_reference.causal_conv1d(np, x, weight, bias, conv_state, meta, silu)

    def gated_delta_net_rule(
        self, mixed, ba, neg_a, dt_bias, state, meta: AttentionMetadata, spec: GatedDeltaNetSpec
    ) -> np.ndarray:
        return recurrent_reference.gated_delta_net_rule(np, mixed, ba, neg_a, dt_bias, state, meta, spec)

    def gated_rms_norm(self, x: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        return recurrent_reference.gated_rms_norm(np, x, z, weight, eps)

    def gated_delta_net_mixer(
        self, qkv, conv_weight, conv_state, ba, neg_a, dt_bias, state, meta: AttentionMetadata,
        spec: GatedDeltaNetSpec, z, norm_weight, eps: float,
    ) -> np.ndarray:
        mixed = self.causal_conv1d(qkv, conv_weight, None, conv_state, meta, silu=True)
        core = self.gated_delta_net_rule(mixed, ba, neg_a, dt_bias, state, meta, spec)
        return self.gated_rms_norm(core, z, norm_weight, eps)

    def ssd_scan(self, x, dt, dt_bias, a, b, c, d, ssm_state, meta: AttentionMetadata, chunk_size: int):
        return ssd_scan(np, x, softplus(np, dt + dt_bias), a, b, c, d, ssm_state, meta, chunk_size)

    def gated_group_rms_norm(self, y: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float, groups: int):
        return gated_group_rms_norm(np, y, z, weight, eps, groups)
