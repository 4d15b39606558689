"""fresh_rng: a fixed seed per test by default, PADDOCK_TEST_SEED to replay or explore."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import fresh_rng

NODE = "tests/engine/cuda/test_emulated_kernels.py::test_gemv_emulated[Q4_K-1-2-8]"


def test_the_default_seed_is_fixed_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PADDOCK_TEST_SEED", raising=False)
    (rng_a, seed_a), (rng_b, seed_b) = fresh_rng(NODE), fresh_rng(NODE)
    assert seed_a == seed_b and np.array_equal(rng_a.random(8), rng_b.random(8))
    assert fresh_rng(NODE.replace("Q4_K", "Q6_K"))[1] != seed_a


def test_a_number_replays_and_random_explores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PADDOCK_TEST_SEED", "1234")
    rng, seed = fresh_rng(NODE)
    assert seed == 1234 and np.array_equal(rng.random(4), np.random.default_rng(1234).random(4))
    monkeypatch.setenv("PADDOCK_TEST_SEED", "random")
    assert 0 <= fresh_rng(NODE)[1] < 2**32
    monkeypatch.setenv("PADDOCK_TEST_SEED", "fixed")
    with pytest.raises(ValueError, match="PADDOCK_TEST_SEED must be a number or 'random', not 'fixed'"):
        fresh_rng(NODE)
