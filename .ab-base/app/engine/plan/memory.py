"""The one memory model: what a model takes on its device under given options, and how many KV blocks
the engine allocates. `paddock fit`, the Studio's will-it-fit and the engine all count with it.

    total = weights + vision tower + audio side + weight cache + expert staging + KV cache + recurrent state
            + activations + runtime overhead

- weights: the tensors' bytes as stored (they stay in their file's quantized layout).
- KV cache: whole blocks of `block_size` tokens; a block holds layers x kv_heads x (key_dim +
  value_dim) x block_size elements (float16 2 bytes, fp8 1, float32 4; "auto" is float16 on CUDA and
  float32 on the CPU), and fp8 adds one float32 scale per layer, K or V, KV head and block (so it holds
  just under twice float16's context in the same memory). The verdict counts `batch` sequences of the
  full context, or the fixed pool of `num_kv_blocks` where one is given (a task model's engine).
- recurrent state (hybrid models: Gated DeltaNet, Mamba-2 layers): a fixed float32 state per
  sequence (state_bytes_per_sequence), in rows of one array per recurrent layer: a null row, a slot per
  sequence (max_num_seqs) and, with prefix caching, the prefix cache's snapshots (`state_rows`):
  --state-snapshot-gb of them, else STATE_SNAPSHOT_SHARE of the cache room (what the KV cache and the
  state share), at most SNAPSHOTS_PER_SEQ per slot; with speculative decoding one more row per slot
  (the checkpoint a verify step rolls back to: cache/state_cache.py).
- activations: the engine's reserve for one step of T = min(max_num_batched_tokens, context) tokens,
  in float32. Only one layer's intermediates are alive at a time:
      T x (4 x hidden                            residual stream, its normed copy, sublayer outputs
           + (2 x heads + 2 x kv_heads) x head_dim   q, k, v and the attention output
           + 3 x intermediate) x 4               MLP gate, up and their product
  plus the sampler's rows: 6 float32 copies of max_num_seqs x vocab logits (logits, penalties,
  probabilities, sorted values and indices, noise). Attention is tiled (flash-style), so no
  T x context score matrix is counted.
- weight cache (CUDA): float16 copies of the projections while the GPU has room to spare, and with
  `repack_max_tokens` (PADDOCK_Q4R_MAX_TOKENS) the Q4_K / Q6_K projections' repacked copies for gemv_q4r
  (ModelShape.repacked_bytes), out of the same budget.
- runtime overhead: CUDA context, cuBLAS workspace and allocator slack, a constant
  (`CUDA_RUNTIME_OVERHEAD_BYTES`) to be calibrated against measured peaks on the GPU.

KV blocks (`kv_blocks`): enough for max_num_seqs full-length sequences plus the pool's null block,
capped by the room for them: on the CPU the KV budget (`kv_cache_bytes`, default 2 GiB); on CUDA the
free memory x gpu_memory_utilization less everything else above (the engine measures the free memory
after the weights are loaded, so only activations and state are taken from it then).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from app.engine import envs
from app.engine.backend.fp8_kv import kv_block_bytes_fp8
from app.engine.config import (
    DENSE_CACHE_FRACTION,
    KV_DTYPE_BYTES,
    EngineConfig,
    kv_dtype_name,
    parse_experts_on_gpu,
)
from app.engine.plan.device import MiB
from app.engine.plan.expert_plan import ExpertPlan
from app.engine.plan.shape import ModelShape

# CUDA context (~500 MiB on Hopper), cuBLAS workspace and the caching allocator's slack.
# A first guess; calibrate against measured peaks on the H200 (issue 5 asks for <= 5% error).
CUDA_RUNTIME_OVERHEAD_BYTES = 768 * MiB
# The Python process around a CPU engine: interpreter, numpy, tokenizer tables.
CPU_RUNTIME_OVERHEAD_BYTES = 384 * MiB
CPU_KV_BUDGET_BYTES = 2 << 30  # the CPU engine's KV cache when kv_cache_bytes is not given
ACTIVATION_BYTES = 4  # the engine keeps activations in float32
# Hybrid models without --state-snapshot-gb: the prefix cache's state snapshots may take this share of
# the cache room, and no more than SNAPSHOTS_PER_SEQ per sequence slot (beyond that, rows would only
# hold snapshots LRU eviction drops before anyone asks for them).
STATE_SNAPSHOT_SHARE = 0.2
SNAPSHOTS_PER_SEQ = 8
SAMPLER_ROWS = 6  # float32 copies of each sequence's logits the sampler may hold at once


@dataclass(frozen=True)
class FitOptions:
    """What the memory depends on besides the model: EngineConfig's fields of the same names, and
    `batch` (sequences whose full context the verdict counts)."""

    context_length: int | None = None  # None: the model's own
    batch: int = 1  # sequences that each hold a full context at once
    kv_dtype: str = "auto"
    max_num_batched_tokens: int = EngineConfig.max_num_batched_tokens
    max_num_seqs: int = EngineConfig.max_num_seqs
    gpu_memory_utilization: float = EngineConfig.gpu_memory_utilization
    experts_on_gpu: int | str | None = None  # experts per layer kept on the GPU: a number, "auto", "all"
    block_size: int = EngineConfig.block_size
    kv_cache_bytes: int | None = None  # CPU: the KV budget (None: CPU_KV_BUDGET_BYTES)
    num_kv_blocks: int | None = None  # a fixed block count (None: sized from the room)
    enable_prefix_caching: bool = True  # hybrid models: the prefix cache keeps recurrent-state snapshots
    state_snapshot_gb: float | None = None  # their memory (None: the share rule, `state_rows`)
    weight_cache: str = EngineConfig.weight_cache  # "off": no float16 copies (a task model's engine)
    speculative: str = "off"  # hybrid models: anything else keeps a checkpoint row per state slot
    # products to this many tokens on repacked K-quant copies (their bytes join the weight cache); 0: none
    repack_max_tokens: int = field(default_factory=lambda: envs.PADDOCK_Q4R_MAX_TOKENS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "experts_on_gpu", parse_experts_on_gpu(self.experts_on_gpu))
        if self.context_length is not None and self.context_length < 1:
            raise ValueError(f"context length must be at least 1, not {self.context_length}")
        if min(self.batch, self.max_num_batched_tokens, self.max_num_seqs, self.block_size) < 1:
            raise ValueError("batch, max_num_batched_tokens, max_num_seqs and block_size must be at least 1")
        if not 0.05 <= self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in [0.05, 1], not {self.gpu_memory_utilization}")
        kv_dtype_name(self.kv_dtype)  # fail early on an unknown name

    @classmethod
    def from_engine(cls, config: EngineConfig, context_length: int | None = None) -> FitOptions:
        """The options an engine with `config` plans with (context: its max_model_len, else the model's)."""
        shared = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
        shared.pop("context_length", None)
        return cls(context_length=context_length or config.max_model_len, **shared)


@dataclass(frozen=True)
class MemoryBreakdown:
    weights: int
    kv_cache: int
    activations: int
    overhead: int
    weight_cache: int = 0  # CUDA: float16 copies of the projections (memory traded for speed)
    expert_staging: int = 0  # slots for cold experts copied in per step
    host_experts: int = 0  # experts kept in pinned host RAM (not device memory: not in the total)
    experts_on_gpu: int | None = None  # per layer, when only a hot set is resident
    pcie_bytes_per_token: float = 0.0  # cold experts copied in per decoded token (uniform routing)
    vision_weights: int = 0  # the image tower's weights
    vision_activations: int = 0  # its working set while it encodes one image
    audio_weights: int = 0  # the audio side's encoder (tower), projector and LoRA adapter
    audio_activations: int = 0  # the encoder's working set for a clip (AudioShape.clip)
    state: int = 0  # hybrid models: the recurrent state rows (the null row, slots and snapshots)
    state_slots: int = 0
    state_snapshots: int = 0

    @property
    def vision(self) -> int:
        return self.vision_weights + self.vision_activations

    @property
    def audio(self) -> int:
        return self.audio_weights + self.audio_activations

    @property
    def total(self) -> int:
        return (
            self.weights + self.weight_cache + self.expert_staging + self.kv_cache + self.activations + self.overhead
            + self.vision + self.audio + self.state
        )

    @property
    def besides_kv(self) -> int:
        return self.total - self.kv_cache


def resolve_kv_dtype(name: str, device_kind: str) -> str:
    """The KV element type allocated for `name` on a device kind ("auto": the backend's own)."""
    return kv_dtype_name(name, "cuda" if device_kind == "cuda" else "cpu")


def kv_block_bytes(shape: ModelShape, block_size: int, kv_dtype: str) -> int:
    """Bytes of one KV block over the layers that own a cache, K and V; FP8 counts its per-(block, head)
    scales."""
    if kv_dtype == "fp8" and shape.kv_layers:
        return 2 * sum(kv_block_bytes_fp8(block_size, heads, dim) for heads, dim in shape.kv_layers)
    if kv_dtype == "fp8":
        value_dim = shape.value_head_dim or shape.head_dim
        per_layer = kv_block_bytes_fp8(block_size, shape.num_kv_heads, shape.head_dim)
        if value_dim != shape.head_dim:
            per_layer = (per_layer + kv_block_bytes_fp8(block_size, shape.num_kv_heads, value_dim)) // 2
        return 2 * shape.num_layers * per_layer
    return shape.kv_bytes_per_token(KV_DTYPE_BYTES[kv_dtype]) * block_size


def kv_cache_bytes(shape: ModelShape, context_length: int, batch: int, kv_dtype: str, block_size: int) -> int:
    """`batch` sequences of `context_length` tokens, each in whole blocks."""
    return batch * -(-context_length // block_size) * kv_block_bytes(shape, block_size, kv_dtype)


def activation_bytes(shape: ModelShape, step_tokens: int, max_num_seqs: int) -> int:
    per_token = (
        4 * shape.hidden_size
        + (2 * shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
        + 3 * shape.intermediate_size
    )
    sampler = SAMPLER_ROWS * max_num_seqs * shape.vocab_size
    return (step_tokens * per_token + sampler) * ACTIVATION_BYTES


def weight_copy_bytes(shape: ModelShape, repacked: bool = False) -> int:
    """float16 copies of every projection and the output head: what the CUDA backend's
    weight cache (app/engine/backend/cuda/dense.py) holds when it is on; with `repacked`, the
    K-quant projections' copies for gemv_q4r too."""
    s = shape
    per_layer = 2 * s.num_heads * s.head_dim + 2 * s.num_kv_heads * s.head_dim + 3 * s.intermediate_size
    float16 = 2 * (s.num_layers * per_layer * s.hidden_size + s.vocab_size * s.hidden_size)
    return float16 + (s.repacked_bytes if repacked else 0)


def use_weight_cache(weight_bytes: int, copy_bytes: int, free_bytes: int | None) -> bool:
    """The engine's "auto" rule: keep float16 copies only on a GPU with room to spare (at least
    twice the weights plus their copies free), so they never take the KV cache's memory."""
    return free_bytes is not None and free_bytes >= 2 * (weight_bytes + copy_bytes)


def weight_cache_bytes(shape: ModelShape, free_bytes: int | None, repacked: bool = False) -> int:
    """Predicted bytes of the weight copies under the "auto" rule, capped at the backend's share."""
    copies = weight_copy_bytes(shape, repacked)
    if free_bytes is None or not use_weight_cache(shape.weight_bytes, copies, free_bytes):
        return 0
    return min(copies, int(DENSE_CACHE_FRACTION * free_bytes))


def state_rows(
    per_sequence: int, max_num_seqs: int, prefix_caching: bool, snapshot_gb: float | None, room: int
) -> tuple[int, int]:
    """(sequence slots, snapshot rows) of a hybrid model's recurrent state; (0, 0) without one."""
    if not per_sequence:
        return 0, 0
    snapshots = 0
    if prefix_caching:
        if snapshot_gb is not None:
            snapshots = int(snapshot_gb * (1 << 30)) // per_sequence
        else:
            share = int(max(room, 0) * STATE_SNAPSHOT_SHARE) // per_sequence
            snapshots = min(share, SNAPSHOTS_PER_SEQ * max_num_seqs)
    return max_num_seqs, snapshots


def state_bytes(per_sequence: int, slots: int, snapshots: int, checkpoints: bool = False) -> int:
    """The recurrent state arrays' bytes: the null row, the slots, the snapshots and (speculative
    decoding) a checkpoint per slot."""
    return (1 + slots * (2 if checkpoints else 1) + snapshots) * per_sequence if slots else 0


MAX_SNAPSHOT_INTERVAL = 4096  # tokens: beyond it a shared prompt would resume too far from where it differs


def snapshot_interval(shape: ModelShape, block_size: int, kv_dtype: str) -> int:
    """The prompt interval between a hybrid model's state snapshots when none is given: as many tokens as
    one snapshot's bytes hold in KV (a snapshot then costs about what the KV of the tokens it spans costs),
    in whole blocks, at least one block and at most MAX_SNAPSHOT_INTERVAL. Qwen3.5-27B-shaped in float16
    KV: ~150 MB of state against ~64 KB a token, ~2,300 tokens; a tiny test model: a block or two."""
    per_token = shape.kv_bytes_per_token(KV_DTYPE_BYTES[kv_dtype])
    if not shape.state_bytes_per_sequence or not per_token:
        return MAX_SNAPSHOT_INTERVAL
    tokens = -(-shape.state_bytes_per_sequence // per_token)
    return min(MAX_SNAPSHOT_INTERVAL, max(block_size, -(-tokens // block_size) * block_size))


def state_host_rows(per_sequence: int, snapshots: int, kv_host_gb: float) -> int:
    """Rows of the host-RAM snapshot tier: --kv-host-gb of a hybrid model's snapshots (its KV blocks do
    not go to host RAM: a prefix hit needs the state there too); 0 without device snapshots."""
    if not per_sequence or not snapshots or not kv_host_gb:
        return 0
    return int(kv_host_gb * (1 << 30)) // per_sequence


def cache_room(
    base: MemoryBreakdown, options: FitOptions, device_kind: str, free_bytes: int | None, weights_loaded: bool
) -> int:
    """Bytes the KV cache and a hybrid model's state rows share: on the CPU the KV budget; on CUDA the
    free memory x gpu_memory_utilization less all the rest (only activations once the weights are in)."""
    if device_kind != "cuda":
        return options.kv_cache_bytes or CPU_KV_BUDGET_BYTES
    taken = base.activations if weights_loaded else base.besides_kv - base.state
    return int((free_bytes or 0) * options.gpu_memory_utilization) - taken


def memory(
    shape: ModelShape,
    options: FitOptions,
    device_kind: str,
    free_bytes: int | None = None,
    experts: ExpertPlan | None = None,
    weights_loaded: bool = False,
) -> MemoryBreakdown:
    """The device memory `shape` takes under `options`. With `experts` (a hot set smaller than all
    experts), only the hot set counts as weights. `weights_loaded`: `free_bytes` was read after the
    weights were loaded (the engine's case), which moves the state's share of the room."""
    context = options.context_length or shape.context_length
    kv_dtype = resolve_kv_dtype(options.kv_dtype, device_kind)
    cuda = device_kind == "cuda"
    overhead = CUDA_RUNTIME_OVERHEAD_BYTES if cuda else CPU_RUNTIME_OVERHEAD_BYTES
    offload: dict[str, Any] = {}
    if experts is not None and not experts.all_on_gpu:
        offload = dict(
            expert_staging=experts.staging_bytes,
            host_experts=experts.host_bytes,
            experts_on_gpu=experts.on_gpu,
            pcie_bytes_per_token=experts.pcie_bytes_per_token,
        )
    base = MemoryBreakdown(
        weights=shape.weight_bytes - offload.get("host_experts", 0),
        **offload,
        kv_cache=kv_cache_bytes(shape, context, options.batch, kv_dtype, options.block_size)
        if not options.num_kv_blocks  # a fixed pool (a task model's engine) is what is allocated
        else options.num_kv_blocks * kv_block_bytes(shape, options.block_size, kv_dtype),
        activations=activation_bytes(shape, min(options.max_num_batched_tokens, context), options.max_num_seqs),
        overhead=overhead,
        weight_cache=weight_cache_bytes(shape, free_bytes, options.repack_max_tokens > 0)
        if cuda and options.weight_cache != "off"
        else 0,
        vision_weights=shape.vision.weight_bytes if shape.vision else 0,
        vision_activations=shape.vision.activation_bytes() if shape.vision else 0,
        audio_weights=shape.audio.weight_bytes + shape.audio.adapter_bytes if shape.audio else 0,
        audio_activations=shape.audio.activation_bytes if shape.audio else 0,
    )
    if not shape.state_bytes_per_sequence:
        return base
    room = cache_room(base, options, device_kind, free_bytes, weights_loaded)
    slots, snapshots = state_rows(shape.state_bytes_per_sequence, options.max_num_seqs,
                                  options.enable_prefix_caching, options.state_snapshot_gb, room)  # fmt: skip
    checkpoints = options.speculative != "off"
    return replace(base, state=state_bytes(shape.state_bytes_per_sequence, slots, snapshots, checkpoints),
                   state_slots=slots, state_snapshots=snapshots)  # fmt: skip


def kv_blocks(
    shape: ModelShape,
    options: FitOptions,
    device_kind: str,
    free_bytes: int | None,
    experts: ExpertPlan | None = None,
    weights_loaded: bool = False,
) -> int:
    """The KV blocks the engine allocates (the pool's null block included): max_num_seqs sequences of
    the context, capped by the room (module docstring). `free_bytes` is the device's free memory before
    the weights are loaded, or after with `weights_loaded`; the CPU's room is its KV budget instead."""
    if options.num_kv_blocks:
        return options.num_kv_blocks
    positions = min(options.context_length or shape.context_length, shape.context_length)
    block_bytes = kv_block_bytes(shape, options.block_size, resolve_kv_dtype(options.kv_dtype, device_kind))
    wanted = options.max_num_seqs * -(-positions // options.block_size) + 1
    if not block_bytes:
        return wanted  # no attention layer: the block tables only count positions
    m = memory(shape, options, device_kind, free_bytes, experts, weights_loaded)
    room = cache_room(m, options, device_kind, free_bytes, weights_loaded) - m.state
    return max(2, min(wanted, room // block_bytes))


def max_model_len(shape: ModelShape, options: FitOptions, num_blocks: int) -> int:
    """The context the engine serves: the one asked for (at most the model's), at most what the
    blocks hold (block 0 is the pool's null block)."""
    positions = min(options.context_length or shape.context_length, shape.context_length)
    return min(positions, (num_blocks - 1) * options.block_size)
