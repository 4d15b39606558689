"""Elementwise and normalisation ops of the encoder, written against an array module `xp`.

They work in place on their own temporaries: on 2 CPU cores the encoder's time is split
between the GEMMs and these passes over `[tokens, 1536]` arrays, and every avoided
temporary counts. numpy has no erf ufunc, hence the rational approximation below.
"""

from __future__ import annotations

import math
from typing import Any

Array = Any


def gelu(xp: Any, x: Array, kind: str) -> Array:
    """`x * Φ(x)`: "erf" is BERT's exact form (to within 1.5e-7), "tanh" the GPT-2 approximation."""
    if kind == "tanh":
        inner = x * x
        inner *= 0.044715 * x
        inner += x
        inner *= math.sqrt(2.0 / math.pi)
        xp.tanh(inner, out=inner)
        inner += 1.0
        inner *= 0.5
        inner *= x
        return inner
    upper_tail = normal_upper_tail(xp, xp.abs(x))
    cdf = xp.where(x >= 0, 1.0 - upper_tail, upper_tail)
    cdf *= x
    return cdf


def normal_upper_tail(xp: Any, a: Array) -> Array:
    """P(N(0,1) > a) for a >= 0, i.e. erfc(a/√2)/2, overwriting `a`.

    Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7; numpy has no erf ufunc).
    a/√2 is capped at 5, where erfc is 0 in float32, so exp() never makes denormals,
    which CPUs process tens of times slower than normal floats.
    """
    a *= 1.0 / math.sqrt(2.0)
    xp.minimum(a, 5.0, out=a)
    t = a * 0.3275911
    t += 1.0
    xp.reciprocal(t, out=t)
    tail = t * 1.061405429
    for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        tail += coefficient
        tail *= t
    a *= a
    xp.negative(a, out=a)
    xp.exp(a, out=a)
    tail *= a
    tail *= 0.5
    return tail


def layer_norm(xp: Any, x: Array, weight: Array, bias: Array, eps: float) -> Array:
    centred = x - x.mean(axis=-1, keepdims=True)
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    variance += eps
    centred /= xp.sqrt(variance)
    centred *= weight
    centred += bias
    return centred


def softmax_inplace(xp: Any, x: Array) -> Array:
    """Softmax over the last axis, overwriting `x`.

    Scores more than 80 below their row's max weigh under 2e-35; capping them there keeps
    exp() out of float32 denormals without changing the result.
    """
    x -= x.max(axis=-1, keepdims=True)
    xp.maximum(x, -80.0, out=x)
    xp.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x
