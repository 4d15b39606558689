"""GemvPlan: how one backend's GEMVs launch, the value its kernel wrappers are handed.

It joins the tuning tables of the backend's GPU (kernels/tuning) with its KernelOptions: which
paths are on and the A/B shape overrides. The default plan (default tuning, every path on, no
overrides) is what a wrapper called without one uses: benchmarks and tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from app.engine.kernels import gemv_q4r
from app.engine.kernels import tuning as tuning_tables
from app.engine.kernels.options import KernelOptions, ShapeOverrides
from app.engine.kernels.tuning import LaunchShape, Tuning

# PADDOCK_GEMV_MMA_COPY_<FORMAT>'s default (envs.py says what it measured; tests/engine/test_envs.py keeps the two equal)
MMA_COPY: Mapping[str, int] = MappingProxyType({"Q4_K": 16})
# PADDOCK_GEMV_MMA_COPY_TALL's default: a weight of such a format with at least MMA_TALL_ROWS rows (a fused gate/up)
# takes gemv_mma up to this many tokens, where its many rows keep gemv_mma2's blocks busy (envs.py says what it measured)
MMA_COPY_TALL = 32
MMA_TALL_ROWS = 16384
# PADDOCK_GEMV_MMA_SPLITS's default: column splits of a gemv_mma2 row tile, a thread-block cluster (envs.py)
MMA_SPLITS = 8


@dataclass(frozen=True, eq=False)
class GemvPlan:
    tuning: Tuning = tuning_tables.DEFAULT
    overrides: ShapeOverrides = field(default_factory=ShapeOverrides)
    int_x: bool = True  # single-token products over int16 x (gemv_int.cu) where they serve
    int_multi: bool = True  # q/k/v in one such launch
    resident_cap: bool = True  # grids capped at the blocks the GPU holds at once
    # products of linear.DENSE_FROM_TOKENS (3) to this many tokens on gemv_mma, copy or not; 0: none
    mma_max_tokens: int = 0
    mma_no_copy: int = 64  # the same bound for a weight without a float16 copy
    mma_kernel: str = "v2"  # gemv_mma's kernel: "v1" gemv_mma.cu, "v2" gemv_mma2.cu
    # {format: the same bound as mma_max_tokens for weights of that format with a float16 copy}; the larger wins
    mma_copy: Mapping[str, int] = field(default_factory=lambda: MMA_COPY)
    groups_per_thread: int | None = None  # XQ_QB's cap; None: the tuning's
    fused_norm_max_cols: int | None = None  # None: the tuning's
    float_x_from: Mapping[str, int] = field(default_factory=dict)  # over the tuning's; 0: never
    # products of q4r_min_tokens to q4r_max_tokens tokens on the weights' repacked copies (gemv_q4r); 0: none
    q4r_max_tokens: int = 0
    q4r_min_tokens: int = 2
    # mma_copy's bound for a weight of at least MMA_TALL_ROWS rows (a fused gate/up), where larger
    mma_copy_tall: int = MMA_COPY_TALL
    mma_splits: int = MMA_SPLITS  # most column splits of a gemv_mma2 row tile (2 without thread-block clusters)

    @classmethod
    def for_backend(cls, options: KernelOptions, tuning: Tuning) -> GemvPlan:
        return cls(tuning, options.gemv_overrides, options.gemv_int_x, options.gemv_int_multi,
                   options.gemv_resident_cap, options.gemv_mma_max_tokens, options.gemv_mma_no_copy,
                   options.gemv_mma_kernel, options.gemv_mma_copy, options.gemv_groups_per_thread,
                   options.fused_norm_max_cols, options.gemv_float_x_from,
                   q4r_max_tokens=options.q4r_max_tokens, q4r_min_tokens=options.q4r_min_tokens,
                   mma_copy_tall=options.gemv_mma_copy_tall, mma_splits=options.gemv_mma_splits)  # fmt: skip

    def q4r_serves(self, n_tok: int) -> bool:
        """Whether a product of `n_tok` tokens goes to a weight's repacked copy when it has one."""
        return self.q4r_min_tokens <= n_tok <= min(self.q4r_max_tokens, gemv_q4r.MAX_TOKENS)

    def float_rows(self, bucket: int, qtype_name: str) -> int:
        """Rows per block of gemv.cu (float32 x) for a token bucket and format."""
        return self.tuning.gemv_rows(bucket, qtype_name)

    def fused_rows(self, bucket: int) -> int:
        return self.tuning.fused_rows(bucket)

    def int_shape(self, kernel: str, n_cols: int, first_format: str) -> LaunchShape:
        """The int16-x launch shape of `kernel` (SINGLE, GATED, MULTI): the tuning's, overrides applied."""
        return self.overrides.apply(
            self.tuning.gemv_int_shape(kernel, n_cols, first_format), kernel, first_format
        )

    def single_takes_float_x(self, qtype_name: str, n_cols: int, n_rows: int) -> bool:
        """Whether a one-weight single-token product of `qtype_name` ([n_rows, n_cols]) goes to the float32-x
        kernel though the int16-x one serves it: from the size where it measured faster. An option's
        cut (A/B runs) is a width alone, 0 never."""
        if qtype_name in self.float_x_from:
            cut = self.float_x_from[qtype_name]
            return bool(cut) and n_cols >= cut
        table = self.tuning.float_x_from(qtype_name)
        return table is not None and n_cols >= table[0] and n_rows >= table[1]

    @property
    def max_groups_per_thread(self) -> int:
        return self.tuning.groups_per_thread if self.groups_per_thread is None else self.groups_per_thread

    @property
    def norm_max_cols(self) -> int:
        return (
            self.tuning.fused_norm_max_cols if self.fused_norm_max_cols is None else self.fused_norm_max_cols
        )


DEFAULT_PLAN = GemvPlan()
