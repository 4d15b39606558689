"""The offload tiers an `EnginePlan` asks for: host RAM, then a disk folder, for evicted prefix blocks."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from app.engine.cache.disk_tier import DiskTier, layout_identity, model_fingerprint, user_kv_dir
from app.engine.cache.offload import HostTier, KVTiers
from app.engine.plan.engine_plan import EnginePlan
from app.engine.plan.shape import ModelShape

log = logging.getLogger(__name__)


def offload_tiers(
    plan: EnginePlan, copier: Any, model_path: Path, shape: ModelShape, disk_dir: str | None = None
) -> KVTiers | None:
    """The host and disk tiers of `plan` (None: neither, or prefix caching off). `disk_dir` None: the
    user cache folder's paddock/kv."""
    if not (plan.kv_host_gb or plan.kv_disk_gb):
        return None
    nbytes = copier.block_nbytes
    host = HostTier(int(plan.kv_host_gb * 2**30) // nbytes, copier) if plan.kv_host_gb else None
    disk = None
    if plan.kv_disk_gb:
        layout = (f"layers={shape.num_layers} kv_heads={shape.num_kv_heads} head_dim={shape.head_dim} "
                  f"block={plan.block_size} dtype={plan.kv_dtype} bytes={nbytes}")  # fmt: skip
        identity = layout_identity(model_fingerprint(model_path), layout)
        root = Path(disk_dir) if disk_dir else user_kv_dir()
        disk = DiskTier(root, int(plan.kv_disk_gb * 2**30), identity, nbytes)
        log.info("KV disk tier: %s, %d blocks found from earlier runs", disk.folder, len(disk))
    return KVTiers(copier, plan.block_size, host, disk)
