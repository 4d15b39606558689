"""The time of an engine step, predicted from its shape and fitted online to the engine's own steps
(core/step_pacing.py paces prefill by it).

A step's time is what its decoders see between two tokens: from the moment the previous step's ids were read
back to the moment its own were (with async decode that is the GPU's time of the step, without it the host's
work too). It is modelled as

    time = decode + c0 + a * P + b * S

where `decode` is the median of the recent decode-only steps, P the step's prefill tokens, S the sum over
them of their positions in their prompts (attention reads everything before a token, so a chunk deep into
a 32k prompt costs more than the same chunk at its start: ~20k tokens/s at 8k context against ~10k
averaged over a 32k prompt on the H100), and c0 what a step with a prefill chunk costs beyond a decode-only
step whatever its size (it runs eagerly where decode-only steps replay a CUDA graph). c0, a and b come from
a least-squares fit over the last WINDOW mixed steps, leaving out those far above what the others predict
(a step that met a stall: a kernel compiled or tuned for a new shape on first use, a collection pause; on
the CPU backend the first step of each new shape took ~100 ms where the next took 13). The ridge that
keeps the fit solvable leans on c0, so that while every chunk has had the same size the cost is put on the
tokens (bigger chunks are then predicted dearer than they are). Pure Python over a few dozen numbers: a
fit takes ~0.1 ms, once per step that carried prefill beside decodes.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from app.engine.core.scheduler import SchedulerOutput

MIN_DECODE_STEPS = 3  # decode-only steps measured before the model predicts
MIN_MIXED_STEPS = 6  # steps with decodes and prefill measured before the model predicts: twice its unknowns
WINDOW, DECODE_WINDOW = 32, 16  # the steps the model remembers: mixed, decode-only
OUTLIER = 4.0  # a mixed step is left out of the fit when it is this many robust deviations above the rest's
MAX_STALLS = 4  # ... and at most this many of the WINDOW
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
