"""The CUDA backend: the numpy backend's op set on an NVIDIA GPU, through CuPy.

Every op is a hand-written kernel from `app/engine/kernels` (compiled at run time by
NVRTC and cached on disk), except matrix products above GEMV_MAX_TOKENS, which go
through cuBLAS on float16 weights (a cached copy, or slices expanded per call: see
dense.py). Weights stay in their GGUF block layout on the GPU; activations are
float32 (parity with numpy), the KV cache float16.

CuPy is imported only when a `CudaBackend` is made or `cuda_available()` is asked, so
the CPU path never loads it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from app.engine.backend import kv_blocks
from app.engine.backend.base import (
    AttentionMetadata,
    QkvRope,
    RopeTable,
    norm_each_head,
    norm_rope_then_cache,
    norm_then_join,
    norm_then_product,
    rope_cache_then_attention,
)
from app.engine.backend.cuda.blas import cublas
from app.engine.backend.cuda.dense import DenseCache
from app.engine.backend.cuda.expand import expand_rows
from app.engine.backend.cuda.experts import StreamedExperts, streamed_moe, unsupported, upload_experts
from app.engine.backend.cuda.linear import gated_linear as _gated_linear
from app.engine.backend.cuda.linear import linear as _linear
from app.engine.backend.cuda.linear import norm_half_linear as _norm_half_linear
from app.engine.backend.cuda.linear import norm_linear as _norm_linear
from app.engine.backend.cuda.linear import takes_half as _takes_half
from app.engine.backend.cuda.weights import CudaFusedWeight, CudaWeight, upload_matrix, upload_vector
from app.engine.backend.fp8_kv import Fp8KvCache
from app.engine.kernels import activation as _activation
from app.engine.kernels import attention as _attention
from app.engine.kernels import attention_cascade as _attention_cascade
from app.engine.kernels import attention_decode as _attention_decode
from app.engine.kernels import attention_prefill as _attention_prefill
from app.engine.kernels import causal_conv1d as _causal_conv1d
from app.engine.kernels import gated_delta as _gated_delta
from app.engine.kernels import kv_cache as _kv_cache
from app.engine.kernels import moe as _moe
from app.engine.kernels import norm as _norm
from app.engine.kernels import rope as _rope
from app.engine.kernels import rope_cache as _rope_cache
from app.engine.kernels import ssd as _ssd
from app.engine.kernels import tuning as _tuning
from app.engine.kernels.gemv_plan import GemvPlan
from app.engine.kernels.options import KernelOptions
from app.engine.kernels.runtime.compile import device_arch
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.specs import GatedDeltaNetSpec, MoeSpec

if TYPE_CHECKING:
    from app.engine.moe.residency import ExpertStreaming

MIN_COMPUTE_CAPABILITY = 80  # Ampere: the oldest architecture the kernels are built and tested for
MIN_FREE_BYTES = 512 << 20

log = logging.getLogger(__name__)
KV_STAGING_BYTES = 256 << 20  # device staging of one piece of a tier copy (~108 blocks of Qwen3-8B)


class CudaUnavailableError(RuntimeError):
    """This machine's GPU cannot run the CUDA backend; the message says why."""


def _device_summary(device_id: int) -> tuple[str, int, int]:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return name, props["major"] * 10 + props["minor"], int(props["totalGlobalMem"])


def cuda_available(device_id: int = 0) -> tuple[bool, str]:
    """Whether the CUDA backend can run here, and a line saying what was found (or why not)."""
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (pip install 'paddock-studio[cuda12]' or '[cuda13]', by driver)"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, driver too old for this CuPy, ...
        return False, f"no usable CUDA driver: {exc}"
    if count <= device_id:
        return False, f"no CUDA GPU number {device_id} (found {count})"
    name, cc, total = _device_summary(device_id)
    if cc < MIN_COMPUTE_CAPABILITY:
        return False, (
            f"{name} has compute capability {cc // 10}.{cc % 10}; the CUDA backend needs "
            f"{MIN_COMPUTE_CAPABILITY // 10}.{MIN_COMPUTE_CAPABILITY % 10} or newer (RTX 30 / A100 and later)"
        )
    return True, f"{name} (sm_{cc}, {total / 2**30:.0f} GiB)"


def _decode_batch(meta: AttentionMetadata, n_tok: int) -> bool:
    """One new token per sequence: what the decode attention kernels take."""
    return meta.decode_only and n_tok == meta.num_seqs


class CudaBackend:
    name = "cuda"
    act_dtype = np.float32
    kv_dtype = np.float16
    # `attention(..., sinks=)` (GPT-OSS) on attention_decode.cu and attention_prefill.cu: head dims
    # 64, 128 and 256 (the SIMT attention.cu has none; attention_prefill.cu's 512 fits only some devices)
    supports_attention_sinks = True
    sink_head_dims = (64, 128, 256)
    # rope.cu, rope_cache.cu and the fused rope decode attention turn only the first 2 x (table width) dims
    # of a head when the table is narrower than half of it (Qwen3.5, Qwen3-Next)
    supports_partial_rope = True
    # Every attention layer's head size must be one of these (attention.cu's; the decode and tensor-core
    # prefill kernels take fewer, and hand the rest to it): layers/attention.py refuses the others at load.
    attention_head_dims = _attention.HEAD_DIMS
    # Which MoE routings `moe` computes on the device (kernels/moe.py routing_supported), with a router softcap,
    # `expert_scale=` (a learned factor per expert's output, Gemma 4) and `score_bias=` (sigmoid routing)
    moe_routing = staticmethod(_moe.routing_supported)

    def __init__(
        self,
        device_id: int = 0,
        min_free_bytes: int = MIN_FREE_BYTES,
        dense_cache: str = "auto",
        kernel_options: KernelOptions | None = None,
    ) -> None:
        """`dense_cache` ("auto", "on", "off"): float16 copies of the weights for products
        above GEMV_MAX_TOKENS tokens, memory traded for speed (dense.py says when).
        `kernel_options`: the kernel path choices (None: their defaults, from app/engine/envs.py)."""
        ok, reason = cuda_available(device_id)
        if not ok:
            raise CudaUnavailableError(reason)
        import cupy

        self.xp = cupy
        self.device = cupy.cuda.Device(device_id)
        self.device.use()
        self.description = reason
        free, total = cupy.cuda.runtime.memGetInfo()
        if free < min_free_bytes:
            raise CudaUnavailableError(
                f"{reason}: only {free / 2**20:.0f} MiB of {total / 2**20:.0f} MiB free "
                f"(need at least {min_free_bytes / 2**20:.0f} MiB); close other programs using the GPU"
            )
        self.sm_count = int(self.device.attributes["MultiProcessorCount"])
        self.kernel_options = kernel_options or KernelOptions()
        self.tuning = _tuning.for_arch(device_arch())
        self.gemv_plan = GemvPlan.for_backend(self.kernel_options, self.tuning)
        # Idle blocks of CuPy's pool (an earlier engine of this process) count as free too.
        self.dense_cache = DenseCache(dense_cache, free + int(cupy.get_default_memory_pool().free_bytes()),
                                      q4r=self.kernel_options.q4r_max_tokens > 0)  # fmt: skip
        cublas()  # the handle and its workspace now: never first made inside a graph capture
        self._reported = False
        # Prefill and mixed batches on the tensor-core kernel (attention_prefill.cu); False keeps
        # the SIMT kernel (attention.cu) for comparison.
        self.tensor_core_prefill = True
        self._pinned: list[Any] = []  # pinned host allocations behind alloc_host_blocks' arrays
        self._staged: list[Any] = []  # device staging of block copies that may still be in flight
        self._copied: Any = None  # an event after the latest block copies (None: none since the last sync)
        # set by the engine for `--experts-on-gpu N`: MoE layers keep N experts per layer on the GPU
        # and stream the rest from pinned host RAM (experts.py: StreamedExperts)
        self.expert_streaming: ExpertStreaming | None = None

    # -- memory -------------------------------------------------------------------
    def from_host(self, array: np.ndarray, dtype: Any = None) -> Any:
        return self.xp.asarray(np.asarray(array, dtype=dtype))

    def to_host(self, array: Any) -> np.ndarray:
        return self.xp.asnumpy(array)

    def free_memory(self) -> int:
        """Bytes a new allocation can still get: free device memory plus the pool's idle blocks.

        The engine asks once the weights are loaded (to size the KV cache): the first call
        also logs what the float16 weight cache holds."""
        if not self._reported:
            self._reported = True
            log.info(self.dense_cache.summary())
        pool = self.xp.get_default_memory_pool()
        return int(self.xp.cuda.runtime.memGetInfo()[0]) + int(pool.free_bytes())

    def load_weight(self, tensor: QuantizedTensor) -> CudaWeight | Any:
        if len(tensor.shape) == 1:
            return upload_vector(tensor)
        return self.dense_cache.consider(upload_matrix(tensor))

    def fuse_linear(self, weights: Sequence[CudaWeight], biases: Sequence[Any | None]) -> CudaFusedWeight:
        """As `Backend.fuse_linear`: the parts stay where they are (no copy of their blocks)."""
        if len(weights) != len(biases) or not weights:
            raise ValueError("fuse_linear takes one bias (or None) per weight")
        if any(w.n_cols != weights[0].n_cols for w in weights):
            raise ValueError(f"fused weights must share their input width: {[w.shape for w in weights]}")
        bias = None
        if any(b is not None for b in biases):
            xp = self.xp
            bias = xp.concatenate(
                [
                    xp.zeros(w.n_rows, xp.float32) if b is None else self._f32(b).reshape(-1)
                    for w, b in zip(weights, biases, strict=True)
                ]
            )
        return self.dense_cache.stack(CudaFusedWeight(tuple(weights), bias))

    def load_experts(
        self,
        spec: MoeSpec,
        weights: Sequence[Sequence[QuantizedTensor]],
        biases: Sequence[Sequence[QuantizedTensor | None]],
    ) -> tuple[_moe.StackedExperts, ...] | None:
        """A MoE layer's (gate, up, down) experts stacked for moe.cu, or None where the kernels
        cannot read them (the layer then runs each expert through `linear`, syncing on the host).
        With `expert_streaming` set, a hot set in device slots and the rest in pinned host RAM."""
        reason = unsupported(spec, weights)
        if self.expert_streaming is not None and len(weights) == 2:
            log.info("MoE experts through per-expert products: ungated experts are not streamed from host RAM")
            return None
        if self.expert_streaming is not None:
            if reason is not None:
                raise ValueError(f"--experts-on-gpu {self.expert_streaming.on_gpu}: these experts cannot be "
                                 f"streamed from host RAM ({reason}); use --experts-on-gpu all")  # fmt: skip
            per_expert = sum(ws[0].data.nbytes for ws in weights)
            residency = self.expert_streaming.layer(spec.num_experts, spec.num_used, per_expert)
            return StreamedExperts(spec, weights, biases, residency)
        if reason is not None:
            log.info("MoE experts through per-expert products: no grouped kernel for %s", reason)
            return None
        return tuple(upload_experts(w, b) for w, b in zip(weights, biases, strict=True))

    # MoE layers hand `moe` their shared expert's output and gate logit (`shared`): the few-tokens path adds
    # them in its combine, two launches fewer a decode layer (Qwen3.5-MoE, Qwen3-Next)
    moe_joins_shared = True

    def moe(
        self, x: Any, router_logits: Any, spec: MoeSpec, experts: tuple[_moe.StackedExperts, ...],
        expert_scale: Any = None, score_bias: Any = None, shared: tuple[Any, Any] | None = None,
    ) -> Any:  # fmt: skip
        """The experts' weighted sum `[T, hidden]` for normalised `x [T, hidden]`: routing, grouping
        by expert and the grouped products on the GPU, with no host sync (kernels/moe.py). `experts`:
        (gate, up, down), or (up, down) for ungated ones. `expert_scale` (`[E]`, Gemma 4): each expert's
        output times its factor; `score_bias` (`[E]`, sigmoid routing: Nemotron-H, Laguna) added to the
        scores the experts are chosen on (see `moe_routing`). `shared`: a shared expert's output `[T, hidden]`
        and its gate logits `[T, 1]`, added as `output * sigmoid(logit)`."""
        scale, bias = (None if a is None else self._f32(a) for a in (expert_scale, score_bias))
        join = None if shared is None else _moe.SharedJoin(self._f32(shared[0]), self._rows(shared[1]))
        if isinstance(experts, StreamedExperts):
            routed = streamed_moe(self._f32(x), self._f32(router_logits), spec, experts, scale, bias,
                                  int_x=self.kernel_options.moe_int_x)  # fmt: skip
            return routed if join is None else routed + join.gated()
        gate, up, down = experts if len(experts) == 3 else (None, *experts)
        return _moe.moe_forward(self._f32(x), self._rows(router_logits), spec, gate, up, down, scale, bias,
                                fused_decode=self.kernel_options.moe_fused_decode, shared=join,
                                int_x=self.kernel_options.moe_int_x)  # fmt: skip

    def alloc_kv_cache(
        self, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, dtype: str = "auto"
    ) -> tuple[Any, Any]:
        """`dtype` "auto" or "float16" (float16 arrays), or "fp8": fp8_kv.Fp8KvCache of device arrays,
        e4m3 codes and per-(block, KV head) scales, the numpy backend's layout (kernels/kv_format.py)."""
        if dtype == "fp8":
            return tuple(Fp8KvCache.zeros(num_blocks, block_size, n_kv_heads, head_dim, self.xp) for _ in range(2))
        if dtype not in ("auto", "float16"):
            raise ValueError(f"KV dtype {dtype!r} is not on CUDA; choose auto, float16 or fp8")
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        return self.xp.zeros(shape, self.xp.float16), self.xp.zeros(shape, self.xp.float16)

    # -- whole KV blocks, for the offload tiers (backend/kv_blocks.py) ------------------
    # Copies run on the current stream, so they are ordered with the steps around them: a block
    # read out before its reuse is copied before the next step overwrites it, and a block written
    # back is in place before the step that reads it. Host reads of the payload, and host writes into
    # rows a write_kv_blocks reads, wait for sync_kv_copies(). Any number of blocks moves through one
    # device staging buffer of up to KV_STAGING_BYTES: one gather or scatter per cache leaf, and one copy
    # per run of host rows that sit end to end (kv_blocks.row_runs; a raw cudaMemcpyAsync each,
    # asynchronous from pinned rows). Larger batches go in pieces of that size: the KV pool takes the
    # device memory the plan leaves, so a 3 GB spill must not stage all at once.
    def alloc_host_blocks(self, num_blocks: int, block_nbytes: int) -> np.ndarray:
        """Pinned host memory for `num_blocks` payloads (asynchronous copies need pinned pages)."""
        nbytes = max(1, num_blocks * block_nbytes)
        memory = self.xp.cuda.alloc_pinned_memory(nbytes)
        host = np.frombuffer(memory, np.uint8, num_blocks * block_nbytes).reshape(num_blocks, block_nbytes)
        self._pinned.append(memory)  # np.frombuffer holds a view, not the allocation: keep it alive
        return host

    def read_kv_blocks(self, kv_caches: list, block_ids: Sequence[int], out: Sequence[np.ndarray]) -> None:
        """Start copying the blocks' payloads into host rows `out` (asynchronous into pinned rows)."""
        nbytes = kv_blocks.block_nbytes(kv_caches)
        rows = kv_blocks.host_rows(out, len(block_ids), nbytes)
        for start, stop in _pieces(len(rows), nbytes):
            ids = self.xp.asarray(np.asarray(block_ids[start:stop], dtype=np.int64))
            staged = kv_blocks.gather_blocks(self.xp, kv_caches, ids)
            self._copy_rows(staged, rows[start:stop], to_host=True)

    def write_kv_blocks(self, kv_caches: list, block_ids: Sequence[int], src: Sequence[np.ndarray]) -> None:
        """Copy host payload rows `src` (pinned for an asynchronous copy) into the blocks."""
        nbytes = kv_blocks.block_nbytes(kv_caches)
        rows = kv_blocks.host_rows(src, len(block_ids), nbytes)
        for start, stop in _pieces(len(rows), nbytes):
            ids = self.xp.asarray(np.asarray(block_ids[start:stop], dtype=np.int64))
            staged = self.xp.empty((stop - start, nbytes), self.xp.uint8)
            self._copy_rows(staged, rows[start:stop], to_host=False)
            kv_blocks.scatter_blocks(self.xp, kv_caches, ids, staged)

    def _copy_rows(self, staged: Any, rows: list[np.ndarray], to_host: bool) -> None:
        """Device staging `[n, nbytes]` <-> host rows, one cudaMemcpyAsync per run of adjacent rows on the
        current stream (CuPy's get/set take one contiguous array and cost ~15 us a call)."""
        from cupy.cuda import runtime

        nbytes = staged.shape[1]
        stream = self.xp.cuda.get_current_stream()
        kind = runtime.memcpyDeviceToHost if to_host else runtime.memcpyHostToDevice
        for first, count, host in kv_blocks.row_runs(rows, nbytes):
            device = staged.data.ptr + first * nbytes
            dst, src = (host, device) if to_host else (device, host)
            runtime.memcpyAsync(dst, src, count * nbytes, kind, stream.ptr)
        if self._copied is not None and self._copied.done:  # earlier copies landed: their buffers may go
            self._staged.clear()
        self._staged.append(staged)  # the device buffer must outlive the copies
        self._copied = stream.record()

    def sync_kv_copies(self) -> None:
        """Wait for the block copies started so far (not for work queued after them); their host rows
        may then be read or rewritten."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None
            self._staged.clear()

    def rope_table(self, cos: np.ndarray, sin: np.ndarray) -> RopeTable:
        """A table whose rows are one row broadcast (a NoPE layer's identity: layers/rope.py identity_table)
        goes up as that one row: the kernels clamp every position to the table's last row, so it serves
        every position without the [max_positions, D/2] copy (gigabytes at a NoPE GGUF's 2^20 positions)."""
        if cos.ndim == 2 and len(cos) > 1 and cos.strides[0] == 0 and sin.strides[0] == 0:
            cos, sin = cos[:1], sin[:1]
        return RopeTable(self.from_host(cos, np.float32), self.from_host(sin, np.float32))

    def _f32(self, x: Any) -> Any:
        return self.xp.ascontiguousarray(x, dtype=self.xp.float32)

    def _i32(self, x: Any) -> Any:
        return self.xp.ascontiguousarray(self.xp.asarray(x), dtype=self.xp.int32)

    # -- ops ----------------------------------------------------------------------
    def embedding(self, weight: CudaWeight, token_ids: Any) -> Any:
        ids = self._i32(token_ids).reshape(-1)
        if weight.dense is not None:
            return weight.dense[ids]
        out = self.xp.empty((ids.shape[0], weight.n_cols), self.xp.float32)
        return expand_rows(weight, out, ids)

    def linear(self, x: Any, weight: CudaWeight | CudaFusedWeight, bias: Any | None = None) -> Any:
        return _linear(x, weight, bias, self.dense_cache, self.gemv_plan)

    def gated_linear(self, x: Any, gate_up: CudaFusedWeight, kind: str, then: Any = None) -> Any:
        if len(gate_up.parts) != 2 or gate_up.parts[0].shape != gate_up.parts[1].shape:
            raise ValueError(f"gated_linear needs a fused (gate, up) pair of one shape, got {gate_up.name!r}")
        then = then if isinstance(then, CudaWeight) else None
        return _gated_linear(x, gate_up, kind, self.dense_cache, self.gemv_plan, then)

    def add_rms_norm_linear(
        self, x: Any, residual: Any | None, norm_weight: Any, eps: float, weight: CudaWeight | CudaFusedWeight
    ) -> tuple[Any, Any]:
        return self._norm_then(x, residual, norm_weight, eps, weight, None)

    def add_rms_norm_gated_linear(
        self, x: Any, residual: Any | None, norm_weight: Any, eps: float, gate_up: CudaFusedWeight, kind: str,
        then: Any = None,
    ) -> tuple[Any, Any]:  # fmt: skip
        return self._norm_then(x, residual, norm_weight, eps, gate_up, kind, then)

    def _norm_then(self, x, residual, norm_weight, eps, weight, kind: str | None, then: Any = None) -> tuple[Any, Any]:
        """One fused launch at one token where gemv_int.cu can take it; above, the norm written in float16
        for a product on the weight's float16 copy or gemv_mma2 (no cast kernel), and a gated result in float16 where
        `then`, the product it goes into, reads float16; else the composition, whose gated product also
        writes float16 for such a `then` (gemv_mma's gate/up before a down product on its copy)."""
        x = self._f32(x)
        then = then if isinstance(then, CudaWeight) else None
        if isinstance(weight, CudaFusedWeight):
            residual = None if residual is None else self._f32(residual)
            norm_weight = self._f32(norm_weight)
            done = _norm_linear(x, residual, norm_weight, eps, weight, kind, self.gemv_plan)
            if done is None:
                done = _norm_half_linear(x, residual, norm_weight, eps, weight, kind, self.gemv_plan, then)
            if done is not None:
                return done
        return norm_then_product(self, x, residual, norm_weight, eps, weight, kind, then)

    def rope_and_cache(
        self,
        qkv: Any,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        q_norm: Any | None,
        k_norm: Any | None,
        eps: float,
        positions: Any,
        table: RopeTable,
        interleaved: bool,
        k_cache: Any,
        v_cache: Any,
        slot_mapping: Any,
    ) -> Any:
        """One rope_cache.cu launch where its heads are whole warps of pairs (64 to 512 wide); otherwise
        the op-by-op composition (the tiny test models' 16- and 32-wide heads)."""
        qkv = self._f32(qkv)
        if not _rope_cache.supports(head_dim):
            return norm_rope_then_cache(
                self, qkv, n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps, positions, table, interleaved,
                k_cache, v_cache, slot_mapping,
            )  # fmt: skip
        q = self.xp.empty((qkv.shape[0], n_heads, head_dim), self.xp.float32)
        return _rope_cache.rope_cache(
            qkv, n_heads, n_kv_heads, head_dim,
            None if q_norm is None else self._f32(q_norm), None if k_norm is None else self._f32(k_norm), eps,
            self._i32(positions), table.cos, table.sin, interleaved, k_cache, v_cache, self._i32(slot_mapping), q,
        )  # fmt: skip

    def rope_cache_attention(
        self,
        qkv: Any,
        rope: QkvRope,
        k_cache: Any,
        v_cache: Any,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        softcap: float | None = None,
        then: Any = None,
    ) -> Any:
        """One launch for a decode batch where that pays (attention_decode_qkv: fuses_rope), else
        rope_and_cache then attention. Where `then` (the output projection) reads float16 (takes_half),
        decode attention writes its output in float16: the cast that product would make in a kernel of its own."""
        qkv = self._f32(qkv)
        n_tok = qkv.shape[0]
        half = isinstance(then, CudaWeight) and _takes_half(n_tok, then, self.gemv_plan)
        rotary = 2 * int(rope.table.cos.shape[1])
        heads = (rope.head_dim, rope.n_heads, rope.n_kv_heads)
        fused = _decode_batch(meta, n_tok) and self.fuses_rope(n_tok, rope.n_heads, rope.head_dim)
        # A cascade decode needs q itself (its shared part is a second kernel over the same rows).
        fused = fused and not self._cascades(meta, sliding_window, *heads)
        # FP8: a block's scale depends on every key written into it, which rope_cache + write_kv_fp8 see.
        fused = fused and not isinstance(k_cache, Fp8KvCache)
        fused = fused and self._decode_attention(*heads) and _attention_decode.rope_supported(*heads, rotary)
        if not fused:
            return rope_cache_then_attention(
                self, qkv, rope, k_cache, v_cache, meta, scale, sliding_window, softcap, half_out=half
            )
        n_blocks = self._decode_blocks(meta, n_tok, rope.n_kv_heads, rope.head_dim)
        norms = [None if w is None else self._f32(w) for w in (rope.q_norm, rope.k_norm)]
        return _attention_decode.attention_decode_qkv(
            qkv, rope.n_heads, rope.n_kv_heads, rope.head_dim, *norms, rope.eps, self._i32(meta.positions),
            rope.table.cos, rope.table.sin, rope.interleaved, k_cache, v_cache, self._i32(meta.slot_mapping),
            self._i32(meta.seq_lens), self._i32(meta.block_tables), scale, sliding_window, softcap, n_blocks,
            self.xp.empty((n_tok, rope.n_heads, rope.head_dim), self.xp.float16 if half else self.xp.float32),
            clusters=self.kernel_options.decode_clusters,
        )  # fmt: skip

    def fuses_rope(self, n_seqs: int, n_heads: int, head_dim: int) -> bool:
        """Whether a decode batch of `n_seqs` takes attention_decode_qkv (where rope_supported) rather
        than rope_cache + attention_decode: by the options, and under "auto" by this GPU's tuning."""
        mode = self.kernel_options.decode_rope
        return mode == "all" or (mode == "auto" and self.tuning.decode_rope_pays(n_seqs, n_heads * head_dim))

    def _decode_attention(self, head_dim: int, n_heads: int, n_kv: int) -> bool:
        """Whether decode batches of these heads run attention_decode.cu."""
        return self.kernel_options.decode_attention and _attention_decode.supports(head_dim, n_heads, n_kv)

    def _cascades(
        self, meta: AttentionMetadata, sliding_window: int | None, head_dim: int, n_heads: int, n_kv: int
    ) -> bool:
        """Whether this decode layer reads its batch's shared prefix once (attention_cascade.py): the
        step carries one, the options have the path on, the layer has no window, both kernels exist."""
        return (
            meta.shared_prefix is not None
            and self.kernel_options.cascade_attention
            and not sliding_window
            and self._decode_attention(head_dim, n_heads, n_kv)
            and _attention_prefill.supports(head_dim, n_heads, n_kv)
        )

    def _decode_blocks(self, meta: AttentionMetadata, n_seqs: int, n_kv: int, head_dim: int) -> int:
        """Blocks per (sequence, KV head) of a decode attention launch (attention_decode.plan_blocks)."""
        return _attention_decode.plan_blocks(
            n_seqs, n_kv, int(meta.max_seq_len), self.sm_count, head_dim, self.tuning.decode_blocks_per_sm
        )

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        x = self._f32(x)
        return _norm.rms_norm(x, self._f32(weight), eps, self.xp.empty_like(x))

    def add_rms_norm(self, x: Any, residual: Any, weight: Any, eps: float) -> tuple[Any, Any]:
        x, residual = self._f32(x), self._f32(residual)
        return _norm.add_rms_norm(
            x, residual, self._f32(weight), eps, self.xp.empty_like(x), self.xp.empty_like(x)
        )

    def rms_norm_join(self, x: Any, weight: Any, eps: float, join: Any, scale: Any | None = None) -> Any:
        x, join = self._f32(x), self._f32(join)
        weight, scale = self._f32(weight), None if scale is None else self._f32(scale)
        out = _norm.rms_norm_join(x, weight, eps, join, scale, self.xp.empty_like(x))
        return norm_then_join(self, x, weight, eps, join, scale) if out is None else out  # None: no float4 rows

    def rms_norm_pair(self, x: Any, weight: Any, weight2: Any, eps: float) -> tuple[Any, Any]:
        x, weight, weight2 = self._f32(x), self._f32(weight), self._f32(weight2)
        out, out2 = self.xp.empty_like(x), self.xp.empty_like(x)
        if _norm.rms_norm_pair(x, weight, weight2, eps, out, out2):
            return out, out2
        return self.rms_norm(x, weight, eps), self.rms_norm(x, weight2, eps)

    def rms_norm_heads(self, x: Any, start: int, heads: int, weight: Any, eps: float) -> Any:
        x, weight = self._f32(x), self._f32(weight)
        if _norm.rms_norm_heads(x, start, heads, weight, eps):
            return x
        return norm_each_head(self, x, start, heads, weight, eps)  # runs the float4 kernel does not take

    def rope(self, x: Any, positions: Any, table: RopeTable, interleaved: bool) -> Any:
        x = self._f32(x)
        return _rope.rope(x, self._i32(positions), table.cos, table.sin, interleaved, self.xp.empty_like(x))

    def gated_activation(self, gate: Any, up: Any, kind: str) -> Any:
        gate, up = self._f32(gate), self._f32(up)
        return _activation.gated(gate, up, kind, self.xp.empty_like(gate))

    def write_kv(self, k_cache: Any, v_cache: Any, k: Any, v: Any, slot_mapping: Any) -> None:
        _kv_cache.write_kv(k_cache, v_cache, self._f32(k), self._f32(v), self._i32(slot_mapping))

    def attention(
        self,
        q: Any,
        k_cache: Any,
        v_cache: Any,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        softcap: float | None = None,
        num_splits: int | None = None,
        sinks: Any | None = None,
        half_out: bool = False,
    ) -> Any:
        """As `Backend.attention`; `num_splits` forces a split count (a CUDA graph needs
        one fixed launch shape for every step it replays). `half_out`: a decode batch on
        attention_decode.cu (or a cascade's merge) writes float16 (rope_cache_attention's `then`); other paths
        float32."""
        q = self._f32(q)
        n_tok, n_heads, head_dim = q.shape
        n_kv = k_cache.shape[2]
        sinks = None if sinks is None else self._f32(sinks)
        decode = _decode_batch(meta, n_tok) and num_splits is None
        if decode and self._decode_attention(head_dim, n_heads, n_kv):
            n_blocks = self._decode_blocks(meta, n_tok, n_kv, head_dim)
            out = self.xp.empty(q.shape, self.xp.float16) if half_out else self.xp.empty_like(q)
            if sinks is None and self._cascades(meta, sliding_window, head_dim, n_heads, n_kv):
                own_blocks = self.kernel_options.cascade_own_blocks or min(_attention_cascade.OWN_BLOCKS, n_blocks)
                return _attention_cascade.cascade_decode(
                    q, k_cache, v_cache, self._i32(meta.seq_lens), self._i32(meta.block_tables), meta.shared_prefix,
                    scale, softcap, own_blocks, _attention_cascade.plan_splits(n_kv, self.sm_count),
                    out, self.kernel_options.decode_clusters, self.kernel_options.cascade_key_warps,
                )  # fmt: skip
            return _attention_decode.attention_decode(
                q, k_cache, v_cache, self._i32(meta.seq_lens), self._i32(meta.block_tables), scale,
                sliding_window, softcap, n_blocks, out, self.kernel_options.decode_clusters, sinks=sinks,
            )  # fmt: skip
        if (self.tensor_core_prefill or sinks is not None) and _attention_prefill.supports(head_dim, n_heads, n_kv):
            n_seqs = int(meta.seq_lens.shape[0])
            if num_splits is None:
                num_splits = _attention_prefill.plan_splits(
                    n_tok, n_seqs, n_heads, n_kv, int(meta.max_seq_len), self.sm_count, head_dim
                )
            # A forced count past what its merge takes runs at that maximum: the kernel divides the keys among
            # the grid's splits itself, so any count gives the same attention.
            num_splits = min(num_splits, _attention_prefill.MAX_SPLITS)
            return _attention_prefill.attention_prefill(
                q, k_cache, v_cache, self._i32(meta.query_start_loc), self._i32(meta.seq_lens),
                self._i32(meta.block_tables), scale, sliding_window, softcap, num_splits, self.xp.empty_like(q),
                sinks=sinks,
            )  # fmt: skip
        if sinks is not None:
            raise NotImplementedError(
                f"attention with sinks on CUDA needs head_dim 64, 128 or 256, got {head_dim}; "
                "run this model on the CPU backend (--device cpu)"
            )
        if num_splits is None:
            plan = _attention.plan_splits(
                n_tok, n_kv, int(meta.max_seq_len), self.sm_count, n_heads, head_dim
            )
        else:
            split_len = -(-int(meta.max_seq_len) // num_splits)
            plan = _attention.SplitPlan(num_splits, max(1, split_len))
        return _attention.attention(
            q, k_cache, v_cache, self._i32(meta.query_start_loc), self._i32(meta.seq_lens),
            self._i32(meta.block_tables), scale, sliding_window, softcap, plan, self.xp.empty_like(q),
        )  # fmt: skip

    def softcap(self, x: Any, cap: float) -> Any:
        x = self._f32(x)
        return _activation.softcap(x, cap, self.xp.empty_like(x))

    def output_gate(self, out: Any, gate: Any, kind: str) -> Any:
        """One launch at every batch size, reading the gate's columns of the fused product in place."""
        out = self._f32(out)
        return _activation.output_gate(out, self._rows(gate), kind, self.xp.empty_like(out))

    # -- recurrent layers (hybrid models) ------------------------------------------------
    # One launch per op for a whole varlen batch; at decode (one token per sequence) the entries that
    # read no query_start_loc. The sequences' rows, state slots and flags are read on the device: no
    # host loop and no sync, so a decode step of these layers can be captured in a graph.
    recurrent_syncs_host = False
    def causal_conv1d(
        self, x: Any, weight: Any, bias: Any | None, conv_state: Any, meta: AttentionMetadata, silu: bool = True
    ) -> Any:
        x = self._rows(x)
        return _causal_conv1d.causal_conv1d(
            x, self._f32(weight), None if bias is None else self._f32(bias), conv_state,
            *self._recurrent_meta(meta, x.shape[0]), "silu" if silu else None, self.xp.empty(x.shape, self.xp.float32),
            max_query_len=meta.max_query_len,
        )  # fmt: skip

    def gated_delta_net_rule(
        self, mixed: Any, ba: Any, neg_a: Any, dt_bias: Any, state: Any, meta: AttentionMetadata,
        spec: GatedDeltaNetSpec,
    ) -> Any:
        mixed = self._rows(mixed)
        out = self.xp.empty((mixed.shape[0], spec.num_v_heads, spec.head_v_dim), self.xp.float32)
        return _gated_delta.gated_delta_rule(
            mixed, self._rows(ba), self._f32(neg_a), self._f32(dt_bias), state,
            *self._recurrent_meta(meta, mixed.shape[0]), spec.num_k_heads, spec.tiled_v_heads, out,
            max_query_len=meta.max_query_len,
        )  # fmt: skip

    def gated_rms_norm(self, x: Any, z: Any, weight: Any, eps: float) -> Any:
        x = self._f32(x)
        return _gated_delta.gated_rms_norm(x, self._rows(z), self._f32(weight), eps, self.xp.empty_like(x))

    def gated_delta_net_mixer(
        self, qkv: Any, conv_weight: Any, conv_state: Any, ba: Any, neg_a: Any, dt_bias: Any, state: Any,
        meta: AttentionMetadata, spec: GatedDeltaNetSpec, z: Any, norm_weight: Any, eps: float,
    ) -> Any:
        """At decode one launch (gated_delta_decode_fused); elsewhere the conv, the rule, then the norm."""
        qkv = self._rows(qkv)
        if not _decode_batch(meta, qkv.shape[0]):
            mixed = self.causal_conv1d(qkv, conv_weight, None, conv_state, meta, silu=True)
            core = self.gated_delta_net_rule(mixed, ba, neg_a, dt_bias, state, meta, spec)
            return self.gated_rms_norm(core, z, norm_weight, eps)
        _, slots, initial = self._recurrent_meta(meta, qkv.shape[0])
        shape = (qkv.shape[0], spec.num_v_heads, spec.head_v_dim)
        return _gated_delta.gated_delta_decode_fused(
            qkv, self._f32(conv_weight), conv_state, self._rows(ba), self._f32(neg_a), self._f32(dt_bias), state, slots,
            initial, spec.num_k_heads, spec.tiled_v_heads, self._rows(z), self._f32(norm_weight), eps,
            self.xp.empty(shape, self.xp.float32), self.xp.empty(shape, self.xp.float32),
        )  # fmt: skip

    def _rows(self, x: Any) -> Any:
        """float32 rows of unit column stride, any row stride (a column slice of a projection): no copy
        for those, a contiguous copy for anything else."""
        if x.dtype == self.xp.float32 and x.ndim == 2 and x.strides[1] == 4:
            return x
        return self._f32(x)

    def _recurrent_meta(self, meta: AttentionMetadata, n_tok: int) -> tuple[Any, Any, Any]:
        """(query_start_loc, or None for a decode batch; state slots; has-initial-state flags) on the device."""
        if meta.state_slots is None or meta.has_initial_state is None:
            raise ValueError("a recurrent layer's step needs meta.state_slots and meta.has_initial_state")
        qsl = None if _decode_batch(meta, n_tok) else self._i32(meta.query_start_loc)
        initial = self.xp.ascontiguousarray(self.xp.asarray(meta.has_initial_state), dtype=self.xp.bool_)
        return qsl, self._i32(meta.state_slots), initial

    def ssd_scan(self, x, dt, dt_bias, a, b, c, d, ssm_state, meta: AttentionMetadata, chunk_size: int) -> Any:
        """As `Backend.ssd_scan`, on ssd.cu (Mamba-2; the same launch for prefill chunks and decodes)."""
        _, slots, initial = self._recurrent_meta(meta, x.shape[0])
        f32 = self.xp.float32
        x, dt, b, c = (v.astype(f32, copy=False) for v in (x, dt, b, c))
        return _ssd.ssd_scan(
            x, dt, self._f32(dt_bias), self._f32(a), b, c, self._f32(d), ssm_state, self._i32(meta.query_start_loc),
            slots, initial, self.xp.empty(x.shape, f32),
        )  # fmt: skip

    def gated_group_rms_norm(self, y: Any, z: Any, weight: Any, eps: float, groups: int) -> Any:
        f32 = self.xp.float32
        y, z = (v.astype(f32, copy=False) for v in (y, z))
        return _ssd.gated_group_rms_norm(y, z, self._f32(weight), eps, groups, self.xp.empty(y.shape, f32))


def _pieces(num_rows: int, row_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of rows whose staging fits KV_STAGING_BYTES (one row at least)."""
    step = max(1, KV_STAGING_BYTES // max(1, row_bytes))
    return [(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]
