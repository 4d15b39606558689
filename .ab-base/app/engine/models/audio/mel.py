"""Log-mel features in numpy, as transformers' Qwen3ASRFeatureExtractor computes them (Whisper's
recipe at 128 bins): a centred, reflect-padded STFT with a periodic Hann window, the power of every
frame but the last, a Slaney-normalised mel filter bank, log10 floored at 1e-10 and at 8 below the
clip's maximum, then `(x + 4) / 4`. The clip is zero-padded to `min_length` samples first, and the
frames to a whole number of the encoder's chunks (zeros, outside the frame count)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MelSettings:
    """The feature extractor's settings (preprocessor_config.json, or processor_config.json's
    `feature_extractor`); the defaults are Qwen3-ASR's."""

    feature_size: int = 128
    sampling_rate: int = 16_000
    hop_length: int = 160
    n_fft: int = 400
    min_length: int = 8000  # samples: shorter clips are zero-padded to this


def _hz_to_mel(freq: np.ndarray, scale: str = "slaney") -> np.ndarray:
    """The Slaney mel scale (linear below 1 kHz, logarithmic above) or HTK's (`2595 log10(1 + f/700)`)."""
    freq = np.asarray(freq, np.float64)
    if scale == "htk":
        return 2595.0 * np.log10(1.0 + freq / 700.0)
    mels = freq / (200.0 / 3)
    log_region = freq >= 1000.0
    logstep = np.log(6.4) / 27.0
    mels[log_region] = 15.0 + np.log(freq[log_region] / 1000.0) / logstep
    return mels


def _mel_to_hz(mels: np.ndarray, scale: str = "slaney") -> np.ndarray:
    mels = np.asarray(mels, np.float64)
    if scale == "htk":
        return 700.0 * (np.power(10.0, mels / 2595.0) - 1.0)
    freq = mels * (200.0 / 3)
    log_region = mels >= 15.0
    logstep = np.log(6.4) / 27.0
    freq[log_region] = 1000.0 * np.exp(logstep * (mels[log_region] - 15.0))
    return freq


@functools.cache
def mel_filters(
    num_frequency_bins: int, num_mel: int, sampling_rate: int, scale: str = "slaney",
    f_min: float = 0.0, f_max: float = 8000.0,
) -> np.ndarray:  # fmt: skip
    """`[num_frequency_bins, num_mel]` float64 triangular filters from `f_min` to `f_max`, as
    transformers' `mel_filter_bank`: Slaney-normalised (each filter's area the same) on the Slaney
    scale (Whisper, Qwen3-ASR), unnormalised on the HTK scale (Gemma 4)."""
    ends = _hz_to_mel(np.array([f_min, f_max]), scale)
    edges = _mel_to_hz(np.linspace(ends[0], ends[1], num_mel + 2), scale)
    fft_freqs = np.linspace(0, sampling_rate // 2, num_frequency_bins)
    widths = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(np.zeros(1), np.minimum(down, up))
    if scale == "slaney":
        filters *= 2.0 / (edges[2 : num_mel + 2] - edges[:num_mel])
    return filters


def log_mel(samples: np.ndarray, settings: MelSettings = MelSettings()) -> np.ndarray:
    """Mono float samples at the settings' rate -> `[feature_size, frames]` float32 log-mel, one
    frame per hop (`frames = max(len, min_length) // hop_length`)."""
    x = np.asarray(samples, np.float32).reshape(-1)
    if x.size < settings.min_length:
        x = np.pad(x, (0, settings.min_length - x.size))
    n_fft, hop = settings.n_fft, settings.hop_length
    padded = np.pad(x, n_fft // 2, mode="reflect")
    count = 1 + (padded.size - n_fft) // hop
    frames = np.lib.stride_tricks.as_strided(
        padded, (count, n_fft), (padded.strides[0] * hop, padded.strides[0]), writeable=False
    )
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)  # periodic Hann
    spectrum = np.fft.rfft(frames[:-1] * window, axis=-1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)  # [frames, bins]
    filters = mel_filters(n_fft // 2 + 1, settings.feature_size, settings.sampling_rate).astype(np.float32)
    mel = filters.T @ power.T
    log_spec = np.log10(np.maximum(mel, np.float32(1e-10)))
    log_spec = np.maximum(log_spec, log_spec.max() - np.float32(8.0))
    return ((log_spec + np.float32(4.0)) / np.float32(4.0)).astype(np.float32)
