"""What the Mamba-2 hybrids' CUDA kernel wrappers accept, asked without a GPU: kernels/ssd.py's layouts
(strides are host facts) and the Nemotron-H router kernel's limits.

x, B and C are column ranges of the conv's output rows and dt, z of the projection's, so only their rows
may be strided; an axis of length 1 (B and C of a model with one group: Granite 4.0-H) may carry any
stride a reshape left it.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.kernels.ssd import row_stride


def test_column_ranges_read_in_place_with_their_row_stride() -> None:
    xbc = np.zeros((5, 200), np.float32)
    assert row_stride(xbc[:, :128].reshape(5, 4, 32), "x") == 200
    assert row_stride(xbc[:, 128:160].reshape(5, 2, 16), "B") == 200
    one_group = np.lib.stride_tricks.as_strided(xbc[:, 160:], (5, 1, 16), (800, 800, 4))  # a size-1 axis's stride
    assert row_stride(one_group, "C") == 200
    assert row_stride(xbc[:1, 20:30], "dt") == 200


@pytest.mark.parametrize(("array", "what"), [
    (np.zeros((5, 4, 8), np.float32).transpose(0, 2, 1), "each row must be contiguous"),
    (np.zeros((5, 16), np.float32)[:, ::2], "each row must be contiguous"),
    (np.zeros((5, 16), np.float64), "expected float32"),
])  # fmt: skip
def test_layouts_the_kernel_cannot_read_are_refused_by_name(array: np.ndarray, what: str) -> None:
    with pytest.raises(ValueError, match=f"x: {what}"):
        row_stride(array, "x")


def test_nemotron_routings_beyond_the_router_kernel_keep_the_per_expert_path() -> None:
    """moe_route (a warp a token) holds up to 1,024 experts' choice values, the sigmoid mode in up to 64 equal
    groups: past that, `unsupported` names why and the layer keeps its per-expert loop (no GPU needed to ask)."""
    from app.engine.backend.cuda.experts import unsupported
    from app.engine.specs import MoeSpec

    def spec(experts: int, groups: int) -> MoeSpec:
        return MoeSpec(experts, 4, 64, routing="sigmoid_grouped", num_groups=groups, activation="relu2")

    assert unsupported(spec(512, 8), []) is None
    assert unsupported(spec(1024, 1), []) is None
    assert "2048 experts (the router takes up to 1024)" in unsupported(spec(2048, 1), [])
    assert "8 experts in 3 groups" in unsupported(spec(8, 3), [])
