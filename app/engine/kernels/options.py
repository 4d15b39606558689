"""KernelOptions: the kernel path choices of one CUDA backend, fixed when it is made.

Each field's default comes from its environment switch (app/engine/envs.py), so A/B runs keep
working (`PADDOCK_PDL=0 python bench/...`); code and tests pass fields explicitly instead. The
backend hands plain values from here to the kernel wrappers, which read no environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from app.engine import envs
from app.engine.kernels.tuning import LaunchShape

DecodeRope = Literal["auto", "all", "off"]
DECODE_ROPE_BY_SWITCH: dict[str, DecodeRope] = {"1": "auto", "all": "all", "0": "off"}


def _from_env(name: str) -> Any:
    return field(default_factory=lambda: getattr(envs, name))


@dataclass(frozen=True)
class ShapeOverrides:
    """Replacements of the int16-x launch shapes at every width (A/B runs), keyed `<KERNEL>` or
    `<KERNEL>_<FORMAT>` (the first weight's format), the more specific key winning."""

    min_blocks: int | None = None  # every build's register cap
    min_blocks_by_key: Mapping[str, int] = field(default_factory=dict)
    shapes_by_key: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)  # (rows, warps, units)

    @classmethod
    def from_env(cls) -> ShapeOverrides:
        return cls(envs.PADDOCK_GEMV_MIN_BLOCKS, envs.PADDOCK_GEMV_MIN_BLOCKS_, envs.PADDOCK_GEMV_SHAPE_)

    def apply(self, shape: LaunchShape, kernel: str, first_format: str) -> LaunchShape:
        if self.min_blocks is not None:
            shape = replace(shape, min_blocks=self.min_blocks)
        for key in (kernel, f"{kernel}_{first_format}"):
            if key in self.shapes_by_key:
                rows, warps, units = self.shapes_by_key[key]
                shape = replace(shape, rows=rows, warps=warps, units=units)
            if key in self.min_blocks_by_key:
                shape = replace(shape, min_blocks=self.min_blocks_by_key[key])
        return shape


@dataclass(frozen=True)
class KernelOptions:
    pdl: bool = _from_env("PADDOCK_PDL")  # programmatic dependent launches in decode graphs (sm_90+)
    decode_attention: bool = _from_env("PADDOCK_DECODE_ATTENTION")  # attention_decode.cu for decode batches
    decode_clusters: bool = _from_env("PADDOCK_DECODE_CLUSTERS")  # its merge through clusters (sm_90+)
    cascade_attention: bool = _from_env("PADDOCK_CASCADE")  # a decode batch's shared prefix read once
    # rope + cache write inside decode attention: "auto" where the tuning says it pays, "all", "off"
    decode_rope: DecodeRope = field(default_factory=lambda: DECODE_ROPE_BY_SWITCH[envs.PADDOCK_DECODE_ROPE])
    gemv_int_x: bool = _from_env("PADDOCK_GEMV_INT_X")  # single-token GEMVs over int16 x (gemv_int.cu)
    gemv_int_multi: bool = _from_env("PADDOCK_GEMV_INT_MULTI")  # q/k/v on that path too
    gemv_resident_cap: bool = _from_env("PADDOCK_GEMV_RESIDENT")  # int16-x grids capped at resident blocks
    gemv_mma_max_tokens: int = _from_env("PADDOCK_GEMV_MMA_MAX_TOKENS")  # 3..N tokens on gemv_mma; 0: off
    gemv_mma_no_copy: int = _from_env("PADDOCK_GEMV_MMA_NO_COPY")  # the same for weights without a float16 copy
    gemv_mma_kernel: str = _from_env("PADDOCK_GEMV_MMA_KERNEL")  # "v1" gemv_mma.cu, "v2" gemv_mma2.cu
    # {format: most tokens on gemv_mma for a weight of that format with a float16 copy}, over gemv_mma_max_tokens
    gemv_mma_copy: Mapping[str, int] = _from_env("PADDOCK_GEMV_MMA_COPY_")
    gemv_mma_copy_tall: int = _from_env("PADDOCK_GEMV_MMA_COPY_TALL")  # ... for such weights of many rows
    gemv_mma_splits: int = _from_env("PADDOCK_GEMV_MMA_SPLITS")  # most column splits of a gemv_mma2 row tile
    q4r_max_tokens: int = _from_env("PADDOCK_Q4R_MAX_TOKENS")  # products to N tokens on repacked K-quants; 0: off
    q4r_min_tokens: int = _from_env("PADDOCK_Q4R_MIN_TOKENS")  # ... from this many tokens
    split_mixed_steps: bool = _from_env("PADDOCK_SPLIT_MIXED_STEPS")  # decodes + a prompt chunk: two graph replays
    gemv_groups_per_thread: int | None = _from_env("PADDOCK_GEMV_QB")  # XQ_QB's cap; None: the tuning's
    fused_norm_max_cols: int | None = _from_env("PADDOCK_FUSED_NORM_MAX_COLS")  # None: the tuning's
    moe_fused_decode: bool = _from_env("PADDOCK_MOE_FUSED_DECODE")  # MoE at 1-4 tokens: no grouping, down+combine
    moe_int_x: bool = _from_env("PADDOCK_MOE_INT_X")  # the grouped MoE products over int16 x (moe_grouped_int_*)
    gemv_overrides: ShapeOverrides = field(default_factory=ShapeOverrides.from_env)
    # {format: columns from which its one-weight single-token products take float32 x; 0: never}, over the tuning's
    gemv_float_x_from: Mapping[str, int] = _from_env("PADDOCK_GEMV_FLOAT_X_")
    cascade_key_warps: int = _from_env("PADDOCK_CASCADE_KEY_WARPS")  # most rows of the key-split shared part
    cascade_own_blocks: int = _from_env("PADDOCK_CASCADE_OWN_BLOCKS")  # own keys' blocks a pair; 0: up to OWN_BLOCKS
    decode_short_context: int = _from_env("PADDOCK_DECODE_SHORT_CONTEXT")  # small buckets' short-context graphs; 0: off

    def __post_init__(self) -> None:
        if self.decode_rope not in ("auto", "all", "off"):
            raise ValueError(f"decode_rope must be auto, all or off, not {self.decode_rope!r}")
        if self.gemv_mma_kernel not in ("v1", "v2"):
            raise ValueError(f"gemv_mma_kernel must be v1 or v2, not {self.gemv_mma_kernel!r}")
        if self.gemv_mma_splits not in (1, 2, 4, 8):
            raise ValueError(f"gemv_mma_splits must be 1, 2, 4 or 8, not {self.gemv_mma_splits!r}")
