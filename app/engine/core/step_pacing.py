"""Step pacing: how many prefill tokens a step may carry while requests decode (issue 38).

A step that carries decodes and a prefill chunk makes every decoder wait for the chunk. At the default
budget of 2,048 tokens, 8 sessions decoding at 2k context stepped every 8.0 ms alone and every 186 ms
(p99) while a 16,000-token prompt prefilled (H100, Qwen3-8B Q4_K_M, bench/suite/agent_engine.py's
interfere case). With `decode_latency_factor` f, a step that carries decodes takes only as many prefill
tokens as keep its predicted time within f times a decode-only step's (aiming at HEADROOM of the extra
time, as measured steps jitter); the long prompt's time to first token pays for it. A step without
decodes takes the whole budget: a lone prompt is not slowed.

The prediction is fitted online from the engine's own steps. A step's time is what its decoders see
between two tokens: from the moment the previous step's ids were read back to the moment its own were
(with async decode that is the GPU's time of the step, without it the host's work too). It is modelled as

    time = decode + c0 + a * P + b * S

where `decode` is the median of the recent decode-only steps, P the step's prefill tokens, S the sum over
them of their positions in their prompts (attention reads everything before a token, so a chunk deep into
a 32k prompt costs more than the same chunk at its start: ~20k tokens/s at 8k context against ~10k
averaged over a 32k prompt on the H100), and c0 what a step with a prefill chunk costs beyond a decode-only
step whatever its size (it runs eagerly where decode-only steps replay a CUDA graph). c0, a and b come from
a least-squares fit over the last WINDOW mixed steps, leaving out those far above what the others predict
(a step that met a stall: a kernel compiled or tuned for a new shape on first use, a collection pause; on
the CPU backend the first step of each new shape took ~100 ms where the next took 13).
The ridge that keeps the fit solvable leans on c0, so that while every chunk has had the same size the
cost is put on the tokens (bigger chunks are then predicted dearer than they are).

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

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from app.engine.core.scheduler import MIN_PACED_CHUNK, SchedulerOutput

DEFAULT_TOKENS = 256  # prefill tokens of a step with decodes while no decode-only step has been measured
WARMUP_TOKENS = 128  # ... and before the model is ready: the scheduler's floor (64) and this, in turn
MIN_DECODE_STEPS = 3  # decode-only steps measured before the model predicts
MIN_MIXED_STEPS = 6  # steps with decodes and prefill measured before the model predicts: twice its unknowns
WINDOW, DECODE_WINDOW = 32, 16  # the steps the model remembers: mixed, decode-only
OUTLIER = 4.0  # a mixed step is left out of the fit when it is this many robust deviations above the rest's
MAX_STALLS = 4  # ... and at most this many of the WINDOW
TRUST = 2  # the model predicts at most this many times the largest prefill it has seen in one step
# the share of the bound's extra time a step aims at: measured steps jitter by a few percent, and the goal
# is on the decoders' p99
HEADROOM = 0.9
UNLIMITED = 1 << 30  # tokens: no prefill cost measured at all
# Features in units that keep the fit well scaled: milliseconds, thousands of tokens, millions of positions.
TOKEN_UNIT, DEPTH_UNIT = 1e3, 1e6
# the ridge: small beside any data, and 1,000 times heavier on c0 than on the token terms, so that chunks of
# one size put their cost on the tokens (module docstring)
RIDGE = (1e-3, 1e-6, 1e-6)

Point = tuple[tuple[float, float, float], float]  # features (1, P, S) in their units, the step's extra ms


@dataclass(frozen=True)
class StepShape:
    """What a step computed, as the cost model reads it: its decode rows and its prefill chunks."""

    decodes: int
    prefill: tuple[tuple[int, int], ...] = ()  # (start, tokens) of each prefill chunk

    @classmethod
    def of(cls, output: SchedulerOutput) -> StepShape:
        """A scheduled step's shape (read before `update()` moves its requests on)."""
        chunks = output.chunks[output.num_decodes :]
        return cls(output.num_decodes, tuple((c.start, c.num_tokens) for c in chunks))

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefill)

    @property
    def depth(self) -> int:
        """The sum over prefill tokens of their positions: what the chunks' attention reads."""
        return sum(chunk_depth(start, n) for start, n in self.prefill)


def chunk_depth(start: int, tokens: int) -> int:
    """Positions start, start + 1, ..., start + tokens - 1, summed."""
    return tokens * start + tokens * (tokens - 1) // 2


def _fit(points: list[Point]) -> list[float]:
    """Ridge least squares of the extra ms on the features: the normal equations, solved."""
    n = len(RIDGE)
    matrix = [[sum(x[i] * x[j] for x, _ in points) + (RIDGE[i] if i == j else 0.0) for j in range(n)]
              for i in range(n)]  # fmt: skip
    return _solve(matrix, [sum(x[i] * y for x, y in points) for i in range(n)])


def _predict(theta: list[float], x: tuple[float, float, float]) -> float:
    return sum(t * f for t, f in zip(theta, x, strict=True))


def _robust_fit(points: list[Point]) -> list[float]:
    """`_fit` without the stalled steps: while the step furthest above the fit is, by the fit of the others,
    more than OUTLIER robust deviations (their median absolute residual, scaled as a standard deviation)
    above it, it is left out (at most MAX_STALLS of them). Only steps above: a stall makes a step slower,
    never faster. Leave-one-out, since a large stall drags a fit that includes it towards itself."""
    kept, theta = points, _fit(points)
    for _ in range(MAX_STALLS):
        if len(kept) <= len(RIDGE) + 1:
            break
        worst = max(range(len(kept)), key=lambda i: kept[i][1] - _predict(theta, kept[i][0]))
        rest = kept[:worst] + kept[worst + 1 :]
        rest_theta = _fit(rest)
        deviation = 1.4826 * statistics.median(abs(y - _predict(rest_theta, x)) for x, y in rest)
        deviation += 0.01 * statistics.median(abs(y) for _, y in rest)  # exact data: a 1% margin
        x, y = kept[worst]
        if y - _predict(rest_theta, x) <= OUTLIER * deviation:
            break
        kept, theta = rest, rest_theta
    return theta


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the matrix is symmetric positive definite: the ridge)."""
    n = len(rhs)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(matrix[r][col]))
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        rhs[col], rhs[pivot] = rhs[pivot], rhs[col]
        for row in range(col + 1, n):
            factor = matrix[row][col] / matrix[col][col]
            rhs[row] -= factor * rhs[col]
            for k in range(col, n):
                matrix[row][k] -= factor * matrix[col][k]
    out = [0.0] * n
    for row in reversed(range(n)):
        out[row] = (rhs[row] - sum(matrix[row][k] * out[k] for k in range(row + 1, n))) / matrix[row][row]
    return out


class StepCostModel:
    """A step's time from its shape (module docstring), fitted from measured steps."""

    def __init__(self) -> None:
        self._decode: deque[float] = deque(maxlen=DECODE_WINDOW)  # decode-only steps' ms
        self._mixed: deque[Point] = deque(maxlen=WINDOW)
        self._theta = [0.0, 0.0, 0.0]
        self.decode_steps = 0  # measured since the start
        self.mixed_steps = 0
        self.largest_prefill = 0  # tokens: the most prefill of one measured mixed step

    @property
    def decode_ms(self) -> float | None:
        """A decode-only step's time: the median of the recent ones."""
        return statistics.median(self._decode) if self._decode else None

    @property
    def ready(self) -> bool:
        return self.decode_steps >= MIN_DECODE_STEPS and self.mixed_steps >= MIN_MIXED_STEPS

    @property
    def coefficients(self) -> tuple[float, float, float]:
        """c0 (ms), a (ms per token), b (ms per token-position), each at least 0: a negative one is noise."""
        c0, a, b = self._theta
        return max(c0, 0.0), max(a, 0.0) / TOKEN_UNIT, max(b, 0.0) / DEPTH_UNIT

    def observe(self, shape: StepShape, seconds: float) -> None:
        """A measured step. Only steps with decodes tell what decoders wait for; a non-positive time is a
        clock that did not move (nothing to learn)."""
        if shape.decodes == 0 or seconds <= 0:
            return
        ms = 1000.0 * seconds
        if not shape.prefill:
            self._decode.append(ms)
            self.decode_steps += 1
            return
        decode_ms = self.decode_ms
        if decode_ms is None:
            return  # nothing to measure the prefill's share against yet
        self._mixed.append(((1.0, shape.prefill_tokens / TOKEN_UNIT, shape.depth / DEPTH_UNIT), ms - decode_ms))
        self._theta = _robust_fit(list(self._mixed))
        self.mixed_steps += 1
        self.largest_prefill = max(self.largest_prefill, shape.prefill_tokens)

    def chunk_ms(self, start: int, tokens: int) -> float:
        """The predicted milliseconds a prefill chunk adds to a step (c0 aside)."""
        _, a, b = self.coefficients
        return a * tokens + b * chunk_depth(start, tokens)

    def chunk_tokens(self, start: int, ms: float) -> int:
        """The most tokens a prefill chunk from `start` may take within `ms` (the inverse of `chunk_ms`)."""
        if ms <= 0:
            return 0
        _, a, b = self.coefficients
        if b == 0.0:
            return UNLIMITED if a == 0.0 else min(UNLIMITED, int(ms / a))
        # b/2 n^2 + (a + b (start - 1/2)) n - ms <= 0
        linear = a + b * (start - 0.5)
        tokens = (-linear + math.sqrt(linear * linear + 2.0 * b * ms)) / b
        tokens = min(UNLIMITED, int(tokens))
        while tokens > 0 and self.chunk_ms(start, tokens) > ms:  # rounding: the bound holds exactly
            tokens -= 1
        return tokens


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

    def __init__(self, model: StepCostModel, factor: float, floor: int) -> None:
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
                 clock: Callable[[], float] = time.perf_counter, floor: int = MIN_PACED_CHUNK) -> None:  # fmt: skip
        if factor < 1.0:
            raise ValueError(f"decode_latency_factor must be at least 1.0 (or 0: off), got {factor}")
        self.factor, self.floor = factor, floor  # floor: the scheduler's `min_paced_chunk`
        self.model = model if model is not None else StepCostModel()
        self._clock = clock
        self._last: float | None = None  # when the previous step's ids were read back
        self._spoiled = False

    def limit(self) -> PrefillBudget:
        return PrefillBudget(self.model, self.factor, self.floor)

    def step_done(self, shape: StepShape) -> None:
        now = self._clock()
        if self._last is not None and not self._spoiled:
            self.model.observe(shape, now - self._last)
        self._last, self._spoiled = now, False

    def step_unsampled(self) -> None:
        self._spoiled = True
