"""Step pacing: how many prefill tokens a step may carry while requests decode (issue 38).

A step that carries decodes and a prefill chunk makes every decoder wait for the chunk. At the default
budget of 2,048 tokens, 8 sessions decoding at 2k context stepped every 8.0 ms alone and every 186 ms
(p99) while a 16,000-token prompt prefilled (H100, Qwen3-8B Q4_K_M, bench/suite/agent_engine.py's
interfere case). With `decode_latency_factor` f, a step that carries decodes takes only as many prefill
tokens as keep its predicted time within f times a decode-only step's (aiming at HEADROOM of the extra
time, as measured steps jitter); the long prompt's time to first token pays for it. A step without
decodes takes the whole budget: a lone prompt is not slowed.

The prediction is a cost model fitted online to the engine's own steps (core/step_cost.py): a step's
time is the decode-only steps' time plus c0 (what any step with prefill adds: it runs eagerly where
decode-only steps replay a CUDA graph) plus a per prefill token plus b per token and position before it
(attention reads the whole context).

Where even the cheapest step with prefill (c0 and the scheduler's floor of 64 tokens) breaks the bound,
cutting cannot keep it, and the floor alone would only stretch the prompt's time to first token: such a
step may then go past the bound `factor` times as far as the cheapest one must (`PrefillBudget`). A step
with decodes never takes more than twice the largest prefill measured in such a step: a fit is not
trusted far beyond what it saw. Before the model is ready (MIN_DECODE_STEPS and MIN_MIXED_STEPS measured)
those steps take the scheduler's floor and twice that in turn: small, and of two sizes, which tells c0 from
a. Until a decode-only step has been measured there is no bound to keep, and a step with decodes takes
DEFAULT_TOKENS. The scheduler applies the limit (`Scheduler.schedule(limit)`) and keeps its own rules: a
step's first prefill chunk still takes at least `min_paced_chunk` tokens (64), so a long prompt always
finishes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from app.engine.core.scheduler import MIN_PACED_CHUNK
from app.engine.core.step_cost import StepCostModel, StepShape

DEFAULT_TOKENS = 256  # prefill tokens of a step with decodes while no decode-only step has been measured
WARMUP_TOKENS = 128  # ... and before the model is ready: the scheduler's floor (64) and this, in turn
TRUST = 2  # the model predicts at most this many times the largest prefill it has seen in one step
# the share of the bound's extra time a step aims at: measured steps jitter by a few percent, and the goal
# is on the decoders' p99
HEADROOM = 0.9

class PrefillBudget:
    """One step's prefill allowance, as the scheduler reads it (`scheduler.PrefillLimit`): integers in and
    out. Either a token count (the model is not ready) or milliseconds left under the bound.

    The bound lets a step with decodes add `extra` = HEADROOM * (factor - 1) * decode ms to a decode-only
    step. Where even the cheapest step with prefill (c0 and a `floor`-token chunk from where the step's first
    chunk starts) adds more, cutting chunks cannot keep it: a step then takes the floor whatever it is told,
    and the floor alone would stretch the prompt's time to first token without bringing the decoders' steps
    down to the bound (H200, 8B, 16k prompt: a step of 8 decodes and 120 prefill tokens took 47 ms at p99,
    of 248 tokens 42, of 2,040 tokens 186, against 6.8 ms without prefill). There the step may go past the
    bound `factor` times as far as the cheapest step must: extra + factor * (cheapest - extra), which is
    the bound itself where the cheapest step just fits it, and about factor times the cheapest step's time
    deep past it."""

    def __init__(self, model: StepCostModel, factor: float, floor: int, max_chunk: int | None = None) -> None:
        self.model = model
        self.ready = model.ready
        self.factor, self.floor = factor, floor
        self.ms_left = 0.0
        self._first = True  # the next `tokens` call is for the step's first prefill chunk
        if model.decode_ms is None:  # no decode-only step measured: no bound to keep yet
            self.tokens_left = DEFAULT_TOKENS
        elif not self.ready:  # the scheduler's floor (0 here) and WARMUP_TOKENS in turn
            self.tokens_left = WARMUP_TOKENS if model.mixed_steps % 2 else 0
        else:
            self.tokens_left = TRUST * model.largest_prefill
            self.extra = HEADROOM * (factor - 1.0) * model.decode_ms
            self.ms_left = self.extra - model.coefficients[0]
        if max_chunk is not None:  # the largest chunk a step with decodes may carry (StepPacer)
            self.tokens_left = min(self.tokens_left, max_chunk)

    def tokens(self, start: int) -> int:
        """The most tokens a prefill chunk from position `start` may take now."""
        if not self.ready:
            return self.tokens_left
        if self._first:  # where the cheapest step with prefill breaks the bound, move it (class docstring)
            self._first = False
            cheapest = self.model.coefficients[0] + self.model.chunk_ms(start, self.floor)
            self.ms_left += self.factor * max(0.0, cheapest - self.extra)
        return min(self.tokens_left, self.model.chunk_tokens(start, self.ms_left))

    def take(self, start: int, num_tokens: int) -> None:
        """A prefill chunk from `start` was scheduled (the scheduler may grant more than `tokens`: its floor)."""
        self.tokens_left = max(0, self.tokens_left - num_tokens)
        if self.ready:
            self.ms_left -= self.model.chunk_ms(start, num_tokens)


class StepPacer:
    """The engine's side: each step's limit for the scheduler, and the steps' times measured for the model.

    The engine calls `limit()` before each `schedule()`, `step_done(shape)` when a step's sampled ids have
    been read back, and `step_unsampled()` after a step that samples nothing (its time then falls into the
    next measured interval, which is therefore thrown away)."""

    def __init__(self, factor: float, model: StepCostModel | None = None,
                 clock: Callable[[], float] = time.perf_counter, floor: int = MIN_PACED_CHUNK,
                 max_chunk: int | None = None) -> None:  # fmt: skip
        if factor < 1.0:
            raise ValueError(f"decode_latency_factor must be at least 1.0 (or 0: off), got {factor}")
        self.factor, self.floor = factor, floor  # floor: the scheduler's `min_paced_chunk`
        # With split mixed steps (worker/runner.py), the largest prefill graph: a step with decodes that stays
        # two replays, so the cost model only sees steps of that kind (an eager one costs ~23 ms more on an 8B)
        self.max_chunk = max_chunk
        self.model = model if model is not None else StepCostModel()
        self._clock = clock
        self._last: float | None = None  # when the previous step's ids were read back
        self._spoiled = False

    def limit(self) -> PrefillBudget:
        return PrefillBudget(self.model, self.factor, self.floor, self.max_chunk)

    def step_done(self, shape: StepShape) -> None:
        now = self._clock()
        if self._last is not None and not self._spoiled:
            self.model.observe(shape, now - self._last)
        self._last, self._spoiled = now, False

    def step_unsampled(self) -> None:
        self._spoiled = True
