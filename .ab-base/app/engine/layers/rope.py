"""Rotary position embedding tables: frequencies (with scaling) and cos/sin per position.

Computed in float32 the way Hugging Face does (inverse frequencies, then position times
frequency, then cos/sin), so our rotations match the reference bit for bit where numpy's
float32 cos/sin agree with torch's.
"""

from __future__ import annotations

import math

import numpy as np

from app.engine.specs import RopeScaling


def inverse_frequencies(
    rotary_dim: int,
    theta: float,
    scaling: RopeScaling | None = None,
    freq_factors: np.ndarray | None = None,
) -> np.ndarray:
    exponents = np.arange(0, rotary_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(rotary_dim)
    inv_freq = np.float32(1.0) / (np.float32(theta) ** exponents)
    if freq_factors is not None:  # GGUF llama 3: the converter stored the divisors per frequency
        return (inv_freq / np.asarray(freq_factors, np.float32)).astype(np.float32)
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
    if scaling.kind == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    if scaling.kind == "yarn":
        return _yarn_scaled(rotary_dim, theta, scaling)
    raise ValueError(f"unsupported RoPE scaling {scaling.kind!r}")


def _llama3_scaled(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    """Llama 3.1's frequency-dependent scaling: long wavelengths scaled, short kept, smooth between."""
    low_wavelen = s.original_max_position / s.low_freq_factor
    high_wavelen = s.original_max_position / s.high_freq_factor
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / np.float32(s.factor), inv_freq)
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / np.float32(s.factor) + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn_scaled(dim: int, theta: float, s: RopeScaling) -> np.ndarray:
    """YaRN (arXiv 2309.00071) as transformers computes it: fast-rotating dimensions keep their
    frequency, slow ones are divided by `factor`, with a linear ramp between beta_fast and beta_slow."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(s.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers does, against a zero-width ramp
    pos_freqs = np.float32(theta) ** (
        np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    )
    extrapolated = np.float32(1.0) / pos_freqs
    interpolated = np.float32(1.0) / (np.float32(s.factor) * pos_freqs)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    keep = np.float32(1.0) - ramp.astype(np.float32)
    return (interpolated * (np.float32(1.0) - keep) + extrapolated * keep).astype(np.float32)


def attention_factor(scaling: RopeScaling | None) -> float:
    """What YaRN multiplies cos and sin by (so q.k by its square): 0.1 ln(factor) + 1; else 1."""
    if scaling is None or scaling.kind != "yarn" or scaling.factor <= 1:
        return 1.0
    return 0.1 * math.log(scaling.factor) + 1.0


def cos_sin_table(
    inv_freq: np.ndarray, max_positions: int, scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """`[max_positions, rotary_dim // 2]` cos and sin (times `scale`: YaRN's attention factor), float32."""
    positions = np.arange(max_positions, dtype=np.float32)
    angles = positions[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    if scale != 1.0:
        cos, sin = cos * np.float32(scale), sin * np.float32(scale)
    return cos, sin


def identity_table(columns: int, max_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """The table of attention without positions (NoPE): every angle 0, so cos 1 and sin 0 turn q and k
    by nothing, exactly. One row serves every position: read-only broadcast views of it, which cost no
    host memory however long the context (a NoPE GGUF says 2^20 positions)."""
    cos = np.broadcast_to(np.ones((1, columns), np.float32), (max_positions, columns))
    return cos, np.broadcast_to(np.zeros((1, columns), np.float32), (max_positions, columns))


def mrope_cos_sin(
    cos: np.ndarray, sin: np.ndarray, positions: np.ndarray, section: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Multimodal RoPE (Qwen2.5-VL): per token `[T, rotary_dim // 2]` cos/sin where frequency j
    rotates by the position id of its section (`positions [3, T]`: t, h, w; `section` the number
    of frequencies of each, in order), gathered from the 1D tables. Equal position ids give
    exactly the 1D rows, so text tokens rotate as plain RoPE."""
    owner = np.repeat(np.arange(len(section)), section)  # frequency -> the section it belongs to
    if owner.size != cos.shape[1]:
        raise ValueError(f"mrope_section {list(section)} does not cover the {cos.shape[1]} frequencies")
    rows = np.asarray(positions, np.int64)[owner]  # [rotary_dim // 2, T]: each frequency's position
    columns = np.arange(owner.size)[:, None]
    return np.ascontiguousarray(cos[rows, columns].T), np.ascontiguousarray(sin[rows, columns].T)
