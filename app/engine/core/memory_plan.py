"""How the engine spends memory: float16 weight copies or not, how many KV blocks, and (hybrid
models) how many recurrent-state rows: a slot per running sequence and the prefix cache's snapshots."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.backend.fp8_kv import kv_block_bytes_fp8
from app.engine.cache.disk_tier import DiskTier, layout_identity, model_fingerprint, user_kv_dir
from app.engine.cache.offload import HostTier, KVTiers
from app.engine.config import EngineConfig
from app.engine.core.expert_residency import ExpertStreaming
from app.engine.models.config import ModelConfig

log = logging.getLogger(__name__)

CPU_KV_BUDGET_BYTES = 2 << 30


def weight_cache_mode(config: EngineConfig, cfg: ModelConfig, checkpoint: Any) -> str:
    """ "auto" becomes "off" unless the GPU has room to spare for float16 weight copies."""
    if config.weight_cache != "auto" or config.device == "cpu":
        return config.weight_cache
    from app.engine.core import fit

    weights = sum(t.nbytes for t in checkpoint.tensors.values())
    shape = fit.ModelShape(cfg.architecture, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                           cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, cfg.context_length, weights)  # fmt: skip
    memory = fit.device_memory()
    free = memory.free_bytes if memory.kind == "cuda" else None
    return "auto" if fit.use_weight_cache(weights, fit.weight_copy_bytes(shape), free) else "off"


def expert_streaming(
    config: EngineConfig, cfg: ModelConfig, backend: Any, model_path: Path, positions: int
) -> ExpertStreaming | None:
    """`--experts-on-gpu` as the backend takes it: None keeps every expert resident (a dense model,
    "all", a number that covers them all on CUDA, or "auto" where everything fits or on the CPU)."""
    requested = config.experts_on_gpu
    if requested in (None, "all"):
        return None
    if cfg.moe is None:
        if requested == "auto":
            return None
        raise ValueError(f"--experts-on-gpu: {cfg.architecture} has no experts")
    if requested == "auto":
        if backend.name == "cpu":
            return None  # the experts are in RAM already
        from app.engine.core import fit

        shape = fit.shape_from_checkpoint(model_path)
        options = fit.FitOptions(
            context_length=positions, kv_dtype=config.kv_dtype_name, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            gpu_memory_utilization=config.gpu_memory_utilization, experts_on_gpu="auto",
        )  # fmt: skip
        device = fit.device_memory()
        budget = None if device.free_bytes is None else int(device.free_bytes * config.gpu_memory_utilization)
        plan = fit.plan_experts(shape, options, device, budget)
        if plan is None or plan.all_on_gpu:
            return None
        requested = plan.on_gpu
    if requested > cfg.moe.num_experts:
        raise ValueError(f"--experts-on-gpu {requested} is more than the model's {cfg.moe.num_experts} experts per layer")
    if requested == cfg.moe.num_experts and backend.name != "cpu":
        return None  # all resident: the stacked experts, inside decode graphs
    log.info("MoE: %d of %d experts per layer on the device, the rest streamed from host RAM",
             requested, cfg.moe.num_experts)  # fmt: skip
    return ExpertStreaming(on_gpu=requested)


def kv_dtype(config: EngineConfig, backend: Any) -> str:
    """The KV element type the engine allocates: "float32", "float16" or "fp8" ("auto": the backend's)."""
    name = config.kv_dtype_name
    return np.dtype(backend.kv_dtype).name if name == "auto" else name


def kv_block_bytes(cfg: ModelConfig, block_size: int, dtype: str) -> int:
    """Bytes of one KV block over the attention layers (a hybrid model's recurrent layers keep no
    KV), K and V; FP8 counts its per-(block, head) scales."""
    layers = len(cfg.attention_layers)
    if dtype == "fp8":
        return 2 * layers * kv_block_bytes_fp8(block_size, cfg.num_kv_heads, cfg.head_dim)
    return 2 * layers * cfg.num_kv_heads * cfg.head_dim * np.dtype(dtype).itemsize * block_size


def cache_budget(config: EngineConfig, cfg: ModelConfig, backend: Any) -> int:
    """Bytes the KV cache and the recurrent state rows share (CPU: kv_cache_bytes; CUDA: the free
    device memory left after the weights, less a reserve for activations, logits and the sampler)."""
    if backend.name == "cpu":
        return config.kv_cache_bytes or CPU_KV_BUDGET_BYTES
    activations = (
        4
        * config.max_num_batched_tokens
        * (4 * cfg.hidden_size + 3 * cfg.intermediate_size + 2 * cfg.num_heads * cfg.head_dim)
    )
    sampler = 6 * 4 * config.max_num_seqs * cfg.vocab_size
    return int(backend.free_memory() * config.gpu_memory_utilization) - activations - sampler


def state_rows(config: EngineConfig, cfg: ModelConfig, budget: int) -> tuple[int, int]:
    """(live slots, snapshot rows) of a hybrid model's recurrent state arrays, by will-it-fit's
    rule (fit.state_rows): a slot per sequence, snapshots with prefix caching; (0, 0) otherwise."""
    from app.engine.core import fit

    return fit.state_rows(cfg.state_bytes_per_sequence, config.max_num_seqs, config.enable_prefix_caching,
                          config.state_snapshot_gb, budget)  # fmt: skip


def state_host_rows(config: EngineConfig, cfg: ModelConfig, snapshots: int) -> int:
    """Rows of the host-RAM snapshot tier: --kv-host-gb of a hybrid model's snapshots (its KV
    blocks do not go to host RAM: a prefix hit needs the state there too); 0 without device ones."""
    per_sequence = cfg.state_bytes_per_sequence
    if not per_sequence or not snapshots or not config.kv_host_gb:
        return 0
    return int(config.kv_host_gb * 2**30) // per_sequence


def state_cache_bytes(cfg: ModelConfig, slots: int, snapshots: int) -> int:
    """Bytes of the recurrent state arrays: the null row, the slots and the snapshots, float32."""
    from app.engine.core import fit

    return fit.state_bytes(cfg.state_bytes_per_sequence, slots, snapshots)


def num_kv_blocks(
    config: EngineConfig, cfg: ModelConfig, backend: Any, positions: int, reserved: int = 0
) -> int:
    """KV blocks: enough for max_num_seqs full-length sequences, capped by the cache budget less
    `reserved` bytes (a hybrid model's recurrent state rows)."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    block_bytes = kv_block_bytes(cfg, config.block_size, kv_dtype(config, backend))
    wanted = config.max_num_seqs * -(-positions // config.block_size) + 1
    if not block_bytes:
        return wanted  # no attention layer: the block tables only count positions
    budget = cache_budget(config, cfg, backend) - reserved
    return max(2, min(wanted, budget // block_bytes))


def offload_tiers(config: EngineConfig, copier: Any, model_path: Path, cfg: ModelConfig, dtype: str) -> KVTiers | None:
    """The host and disk tiers `config` asks for (None: neither, or prefix caching off)."""
    if not config.enable_prefix_caching or not (config.kv_host_gb or config.kv_disk_gb):
        return None
    nbytes = copier.block_nbytes
    host = HostTier(int(config.kv_host_gb * 2**30) // nbytes, copier) if config.kv_host_gb else None
    disk = None
    if config.kv_disk_gb:
        layout = (f"layers={cfg.num_layers} kv_heads={cfg.num_kv_heads} head_dim={cfg.head_dim} "
                  f"block={config.block_size} dtype={dtype} bytes={nbytes}")  # fmt: skip
        identity = layout_identity(model_fingerprint(model_path), layout)
        root = Path(config.kv_disk_dir) if config.kv_disk_dir else user_kv_dir()
        disk = DiskTier(root, int(config.kv_disk_gb * 2**30), identity, nbytes)
        log.info("KV disk tier: %s, %d blocks found from earlier runs", disk.folder, len(disk))
    return KVTiers(copier, config.block_size, host, disk)
