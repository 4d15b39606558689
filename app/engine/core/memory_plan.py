"""How the engine spends memory: float16 weight copies or not, and how many KV blocks."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.config import EngineConfig
from app.engine.models.config import ModelConfig

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


def num_kv_blocks(config: EngineConfig, cfg: ModelConfig, backend: Any, positions: int) -> int:
    """KV blocks: enough for max_num_seqs full-length sequences, capped by the memory budget
    (CPU: kv_cache_bytes; CUDA: the free device memory left after the weights, less a reserve
    for activations, logits and the sampler)."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    itemsize = np.dtype(backend.kv_dtype).itemsize
    block_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize * config.block_size
    wanted = config.max_num_seqs * -(-positions // config.block_size) + 1
    if backend.name == "cpu":
        budget = config.kv_cache_bytes or CPU_KV_BUDGET_BYTES
    else:
        activations = (
            4
            * config.max_num_batched_tokens
            * (4 * cfg.hidden_size + 3 * cfg.intermediate_size + 2 * cfg.num_heads * cfg.head_dim)
        )
        sampler = 6 * 4 * config.max_num_seqs * cfg.vocab_size
        budget = int(backend.free_memory() * config.gpu_memory_utilization) - activations - sampler
    return max(2, min(wanted, budget // block_bytes))
