"""The step cost model (core/step_cost.py) fitted from step records of a synthetic device whose step times
are known exactly.

The synthetic device: a decode-only step of 8 decoders takes 8 ms; a step with prefill adds 1.5 ms, 20 us a
prefill token and 2 ns per token per position before it (a 2,048-token chunk at 14k context: ~100 ms, the
order the H100 showed). With factor 2 a step with decodes may take 16 ms."""

from __future__ import annotations

import pytest

from app.engine.core.step_cost import StepCostModel, StepShape, chunk_depth

DECODE_MS, C0_MS, A_MS, B_MS = 8.0, 1.5, 0.02, 2e-6
FACTOR = 2.0


def true_ms(shape: StepShape, c0: float = C0_MS) -> float:
    ms = DECODE_MS if shape.decodes else 0.0
    if shape.prefill:
        ms += c0 + A_MS * shape.prefill_tokens + B_MS * shape.depth
    return ms


def fitted(mixed: list[StepShape], decode_steps: int = 5) -> StepCostModel:
    model = StepCostModel()
    for _ in range(decode_steps):
        model.observe(StepShape(8), DECODE_MS / 1000)
    for shape in mixed:
        model.observe(shape, true_ms(shape) / 1000)
    return model


def test_the_fit_recovers_a_linear_cost_and_its_inverse_keeps_the_bound() -> None:
    mixed = [StepShape(8, ((start, n),)) for start, n in [(0, 64), (64, 128), (192, 256), (448, 512), (960, 100),
                                                          (4000, 300), (9000, 64), (12000, 700)]]  # fmt: skip
    model = fitted(mixed)
    assert model.ready and model.decode_ms == pytest.approx(DECODE_MS)
    c0, a, b = model.coefficients
    assert c0 == pytest.approx(C0_MS, rel=0.02) and a == pytest.approx(A_MS, rel=0.02)
    assert b == pytest.approx(B_MS, rel=0.02)
    room = (FACTOR - 1) * DECODE_MS - c0
    for start in (0, 1000, 8000, 15000):
        n = model.chunk_tokens(start, room)
        assert model.chunk_ms(start, n) <= room < model.chunk_ms(start, n + 1)
        # against the true cost too: within a token of the exact largest chunk
        exact = max(k for k in range(1, 2000) if A_MS * k + B_MS * chunk_depth(start, k) <= room)
        assert abs(n - exact) <= 1
    assert model.chunk_tokens(0, 0.0) == 0 and model.chunk_tokens(0, -1.0) == 0


def test_one_chunk_size_puts_the_cost_on_the_tokens_not_the_overhead() -> None:
    """Chunks all of 256 tokens cannot tell c0 from a; the ridge puts the cost on the tokens, so a bigger
    chunk is predicted dearer than it is (the bound holds), and 256 tokens costs what was measured."""
    model = fitted([StepShape(8, ((start, 256),)) for start in range(0, 2560, 256)])
    c0 = model.coefficients[0]
    assert c0 < 0.1 * C0_MS
    for start in (0, 2048):
        measured = true_ms(StepShape(8, ((start, 256),))) - DECODE_MS
        assert model.chunk_ms(start, 256) + c0 == pytest.approx(measured, rel=0.05)
        big = StepShape(8, ((start, 1024),))
        assert model.chunk_ms(start, 1024) + c0 >= true_ms(big) - DECODE_MS


def test_a_stalled_step_is_left_out_of_the_fit() -> None:
    """A step that met a stall (a kernel compiled for a new shape: ~100 ms where the next took 13 on the CPU
    backend) does not move the fit: without the check it would read as a large c0 and pin every later step
    to the scheduler's floor."""
    shapes = [StepShape(8, ((64 * i, 64 if i % 2 else 128),)) for i in range(12)]
    model = fitted([])
    for i, shape in enumerate(shapes):
        model.observe(shape, (true_ms(shape) + (100.0 if i == 1 else 0.0)) / 1000)
    assert model.coefficients == pytest.approx((C0_MS, A_MS, B_MS), rel=0.05)
    model.observe(StepShape(8), 0.5)  # and a stalled decode-only step does not move the median
    assert model.decode_ms == DECODE_MS


def test_steps_without_decodes_or_time_teach_nothing() -> None:
    model = StepCostModel()
    model.observe(StepShape(0, ((0, 2048),)), 0.2)  # no decoder waited for it
    model.observe(StepShape(8), 0.0)  # a clock that did not move
    model.observe(StepShape(8, ((0, 256),)), 0.02)  # no decode-only time to measure it against yet
    assert model.decode_ms is None and model.decode_steps == 0 and model.largest_prefill == 0
