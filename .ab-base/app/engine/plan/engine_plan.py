"""`resolve`: every "auto" of an `EngineConfig` decided in one place, into a frozen `EnginePlan`.

Two choices are made before the weights are loaded, since the backend and the model are built
with them: the weight cache (`weight_cache_mode`) and the experts kept on the device
(`experts_on_device`). Both are pure functions of the config, the model's shape and the device's
free memory read once at start, so `resolve` makes them again, beside the rest, and records them.
On CUDA the KV blocks are sized from the free memory measured after the weights are loaded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.engine.config import EngineConfig
from app.engine.plan.device import DeviceMemory, GiB
from app.engine.plan.fit import plan_experts
from app.engine.plan.memory import (
    FitOptions,
    cache_room,
    kv_block_bytes,
    kv_blocks,
    max_model_len,
    memory,
    resolve_kv_dtype,
    snapshot_interval,
    state_host_rows,
    use_weight_cache,
    weight_copy_bytes,
)
from app.engine.plan.shape import ModelShape

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnginePlan:
    device: str  # the backend's name: "cuda" or "cpu"
    kv_dtype: str  # "float32", "float16" or "fp8"
    weight_cache: str  # the backend's float16 copies: "auto", "on" or "off"
    experts_on_gpu: (
        int | None
    )  # a MoE's hot set per layer, the rest streamed from host RAM; None: all resident
    graphs: bool  # decode steps replayed as CUDA graphs
    prefill_graphs: bool  # and one sequence's prefill chunks
    async_decode: bool  # one step of look-ahead (core/pipeline.py)
    max_model_len: int  # the context served
    num_blocks: int  # KV blocks, the pool's null block included
    block_size: int
    kv_host_gb: float  # offload tiers for evicted prefix blocks (0: none)
    kv_disk_gb: float
    # hybrid models: recurrent-state rows, a slot per sequence and the prefix cache's snapshots
    state_slots: int = 0
    state_snapshots: int = 0
    state_bytes: int = 0
    state_host_rows: int = 0  # snapshots evicted to host RAM (--kv-host-gb, for a hybrid model)
    state_snapshot_interval: int = 0  # prompt tokens between state snapshots (0: only at a prompt's end)

    def describe(self) -> str:
        """The plan in one log line."""
        experts = (
            "all resident"
            if self.experts_on_gpu is None
            else f"{self.experts_on_gpu} per layer on the device"
        )
        tiers = f"host {self.kv_host_gb:g} GB, disk {self.kv_disk_gb:g} GB"
        weight_cache = self.weight_cache if self.device == "cuda" else "n/a"
        return (f"plan: {self.device}; context {self.max_model_len}, {self.num_blocks} KV blocks of {self.block_size} "
                f"({self.kv_dtype}); weight cache {weight_cache}; experts {experts}; CUDA graphs {_on(self.graphs)} "
                f"(prefill {_on(self.prefill_graphs)}); async decode {_on(self.async_decode)}; "
                f"KV tiers {tiers if self.kv_host_gb or self.kv_disk_gb else 'none'}"
                + (f"; recurrent state {self.state_slots} slots + {self.state_snapshots} snapshots, one every "
                   f"{self.state_snapshot_interval} prompt tokens"
                   if self.state_slots else ""))  # fmt: skip


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def model_positions(config: EngineConfig, shape: ModelShape) -> int:
    """The longest sequence the model is built for: --max-ctx, at most the model's own context."""
    return min(config.max_model_len or shape.context_length, shape.context_length)


def weight_cache_mode(config: EngineConfig, shape: ModelShape, device: DeviceMemory) -> str:
    """ "auto" becomes "off" unless the GPU has room to spare for float16 weight copies."""
    if config.weight_cache != "auto" or config.device == "cpu":
        return config.weight_cache
    free = device.free_bytes if device.kind == "cuda" else None
    copies = weight_copy_bytes(shape, FitOptions.from_engine(config).repack_max_tokens > 0)
    return "auto" if use_weight_cache(shape.weight_bytes, copies, free) else "off"


def experts_on_device(
    config: EngineConfig, shape: ModelShape, backend_name: str, device: DeviceMemory
) -> int | None:
    """`--experts-on-gpu` as the backend takes it: None keeps every expert resident (a dense model,
    "all", a number that covers them all on CUDA, or "auto" where everything fits or on the CPU)."""
    requested = config.experts_on_gpu
    if requested in (None, "all"):
        return None
    if not shape.num_experts:
        if requested == "auto":
            return None
        raise ValueError(f"--experts-on-gpu: {shape.architecture} has no experts")
    if requested == "auto":
        if backend_name == "cpu":
            return None  # the experts are in RAM already
        options = FitOptions.from_engine(config, model_positions(config, shape))
        budget = None if device.free_bytes is None else int(device.free_bytes * config.gpu_memory_utilization)
        plan = plan_experts(shape, options, device, budget)
        if plan is None or plan.all_on_gpu:
            return None
        requested = plan.on_gpu
    assert isinstance(requested, int)
    if requested > shape.num_experts:
        raise ValueError(
            f"--experts-on-gpu {requested} is more than the model's {shape.num_experts} experts per layer"
        )
    if requested == shape.num_experts and backend_name != "cpu":
        return None  # all resident: the stacked experts, inside decode graphs
    return requested


def check_fixed_pool(shape: ModelShape, options: FitOptions, free_after_load: int) -> None:
    """A fixed pool (--kv-blocks) larger than the GPU's free memory is refused here, naming the flag, rather
    than by the allocator. One past the --gpu-memory-utilization share less the step buffers only gets a
    warning: the user asked for it, and the task models' engines (a pool for one text) are sized by their own
    plan (plan/task_fit.py), not by this share."""
    n = options.num_kv_blocks
    assert n
    block = kv_block_bytes(shape, options.block_size, resolve_kv_dtype(options.kv_dtype, "cuda"))
    if not block:
        return
    if n * block > free_after_load:
        raise ValueError(f"--kv-blocks {n}: {n} blocks of {options.block_size} tokens take {n * block / GiB:.1f} GiB; "
                         f"the GPU has {free_after_load / GiB:.1f} GiB free after the weights, room for at most "
                         f"{free_after_load // block} (less its step buffers)")  # fmt: skip
    m = memory(shape, options, "cuda", free_after_load, weights_loaded=True)
    share = (cache_room(m, options, "cuda", free_after_load, True) - m.state) // block
    if n > share:
        log.warning("a KV pool of %d blocks (--kv-blocks) is more than the %d blocks --gpu-memory-utilization %g "
                    "leaves room for beside the step buffers", n, max(share, 0), options.gpu_memory_utilization)  # fmt: skip


def async_decode_enabled(setting: bool | None, cuda_graphs: bool) -> bool:
    """The config's setting (EngineConfig.async_decode); None means on exactly where decode steps
    are CUDA-graph replays (elsewhere a launch costs about what it hides)."""
    return cuda_graphs if setting is None else setting


def resolve(
    config: EngineConfig,
    shape: ModelShape,
    device: DeviceMemory,
    backend_name: str,
    free_after_load: int | None = None,
    syncs_host: bool = False,
) -> EnginePlan:
    """The plan for `config` on a backend that has loaded the model: `device` is the memory read at start,
    `free_after_load` the CUDA device's free memory now, `syncs_host` whether a forward reads back to the
    host midway (Decoder.syncs_host: MoE layers reading the router's choices, recurrent layers walking the
    batch's sequences; no CUDA graphs then)."""
    positions = model_positions(config, shape)
    options = FitOptions.from_engine(config, positions)
    cuda = backend_name == "cuda"
    experts = experts_on_device(config, shape, backend_name, device)
    blocks = kv_blocks(shape, options, backend_name, free_after_load, weights_loaded=True)
    if options.num_kv_blocks and cuda and free_after_load is not None:
        check_fixed_pool(shape, options, free_after_load)
    # On the GPU the KV blocks are the ones `paddock fit` predicts from the free memory read before the
    # weights (the same count), as long as the weights took no more than the plan counts for them: the
    # count from the memory left after loading caps it. (Experts streamed from host RAM: the count from
    # what is left, as their staging buffers are sized while loading.)
    predicted = cuda and experts is None and device.free_bytes is not None and not options.num_kv_blocks
    if predicted:
        before_load = kv_blocks(shape, options, backend_name, device.free_bytes)
        if before_load > blocks:
            log.warning("the model took more GPU memory than the plan counts for it: %d KV blocks instead of "
                        "the %d `paddock fit` predicts", blocks, before_load)  # fmt: skip
        predicted = before_load <= blocks
        blocks = min(blocks, before_load)
    served = max_model_len(shape, options, blocks)
    if config.max_model_len and config.max_model_len > served:
        limit = "the model's context" if positions < config.max_model_len else "what the KV cache holds"
        log.warning("--max-ctx %d exceeds %s: the context is %d tokens", config.max_model_len, limit, served)
    elif config.num_kv_blocks and served < positions:  # info: a task model's pool bounds its context by design
        log.info("--kv-blocks %d holds %d tokens: the context is %d tokens, not the model's %d",
                 config.num_kv_blocks, served, served, positions)  # fmt: skip
    hybrid = shape.state_bytes_per_sequence > 0
    if cuda and config.cuda_graphs and syncs_host:
        log.warning("CUDA graphs off: this model reads back to the host within a step (MoE layers on "
                    "per-expert products or experts streamed from host RAM, or recurrent layers without "
                    "their CUDA kernels)")  # fmt: skip
    graphs = cuda and config.cuda_graphs and not syncs_host
    state = None
    if hybrid:  # the state rows from the same reading as the blocks
        state = (memory(shape, options, backend_name, device.free_bytes) if predicted
                 else memory(shape, options, backend_name, free_after_load, weights_loaded=True))  # fmt: skip
    tiers = config.enable_prefix_caching
    return EnginePlan(
        device=backend_name,
        kv_dtype=resolve_kv_dtype(config.kv_dtype, backend_name),
        weight_cache=weight_cache_mode(config, shape, device),
        experts_on_gpu=experts,
        graphs=graphs,
        # a hybrid model's prefill runs eagerly: the prefill graphs hold no state rows
        prefill_graphs=graphs and config.prefill_graphs and not hybrid,
        async_decode=async_decode_enabled(config.async_decode, graphs),
        max_model_len=served,
        num_blocks=blocks,
        block_size=config.block_size,
        kv_host_gb=config.kv_host_gb if tiers else 0.0,
        kv_disk_gb=config.kv_disk_gb if tiers else 0.0,
        state_slots=state.state_slots if state else 0,
        state_snapshots=state.state_snapshots if state else 0,
        state_bytes=state.state if state else 0,
        state_host_rows=state_host_rows(
            shape.state_bytes_per_sequence, state.state_snapshots, config.kv_host_gb
        )
        if state
        else 0,
        state_snapshot_interval=_snapshot_interval(config, shape, backend_name) if hybrid else 0,
    )


def _snapshot_interval(config: EngineConfig, shape: ModelShape, backend_name: str) -> int:
    if config.state_snapshot_interval is not None:
        return config.state_snapshot_interval
    return snapshot_interval(shape, config.block_size, resolve_kv_dtype(config.kv_dtype, backend_name))
