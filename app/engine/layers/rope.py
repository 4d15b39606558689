"""Rotary position embedding tables: frequencies (with scaling) and cos/sin per position.

Computed in float32 the way Hugging Face does (inverse frequencies, then position times
frequency, then cos/sin), so our rotations match the reference bit for bit where numpy's
float32 cos/sin agree with torch's.
"""

from __future__ import annotations

import math

import numpy as np

from app.engine.models.config import RopeScaling


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


def cos_sin_table(inv_freq: np.ndarray, max_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """`[max_positions, rotary_dim // 2]` cos and sin, float32."""
    positions = np.arange(max_positions, dtype=np.float32)
    angles = positions[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
