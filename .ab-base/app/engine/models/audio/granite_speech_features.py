"""Granite Speech's input features in numpy, as transformers' GraniteSpeechFeatureExtractor computes them
with torchaudio's MelSpectrogram: a centred, reflect-padded STFT of `n_fft` (512) points whose periodic
Hann window of `win_length` (400) sits in the middle of the frame, the power of every frame, HTK mel
filters without area normalisation (0 Hz to half the rate), log10 floored at 1e-10 and at 8 below the
clip's maximum, then `x / 4 + 1`. An odd last frame is dropped and pairs of frames are stacked side by
side: `[frames / 2, 2 x n_mels]`, one encoder frame per 20 ms. Also the count of audio tokens the clip
becomes (the projector's windows times its queries)."""

from __future__ import annotations

import functools

import numpy as np

from app.engine.models.audio.granite_speech_config import GraniteSpeechAudioConfig, GraniteSpeechMelSettings


def _hz_to_mel(freq: np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + np.asarray(freq, np.float64) / 700.0)


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (np.asarray(mels, np.float64) / 2595.0) - 1.0)


@functools.cache
def htk_filters(num_frequency_bins: int, num_mel: int, sampling_rate: int) -> np.ndarray:
    """`[num_frequency_bins, num_mel]` triangular filters, HTK scale, peak 1 (torchaudio's
    `melscale_fbanks(norm=None, mel_scale="htk")`)."""
    fft_freqs = np.linspace(0, sampling_rate // 2, num_frequency_bins)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sampling_rate / 2), num_mel + 2))
    widths = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    return np.maximum(0.0, np.minimum(down, up)).astype(np.float32)


@functools.cache
def centred_window(n_fft: int, win_length: int) -> np.ndarray:
    """The periodic Hann window of `win_length` zero-padded on both sides to `n_fft`, as torch.stft pads it."""
    n = np.arange(win_length)
    window = np.zeros(n_fft, np.float32)
    left = (n_fft - win_length) // 2
    window[left : left + win_length] = 0.5 - 0.5 * np.cos(2 * np.pi * n / win_length)
    return window


def log_mel_frames(samples: np.ndarray, mel: GraniteSpeechMelSettings) -> np.ndarray:
    """Mono float samples -> `[1 + len // hop, n_mels]` float32 log-mel, before the pairs are stacked."""
    x = np.asarray(samples, np.float32).reshape(-1)
    if x.size <= mel.n_fft // 2:
        raise ValueError(f"{x.size} samples: the clip must be longer than {mel.n_fft // 2} samples")
    padded = np.pad(x, mel.n_fft // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, mel.n_fft)[:: mel.hop_length]
    spectrum = np.fft.rfft(frames * centred_window(mel.n_fft, mel.win_length), axis=-1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)  # [frames, bins]
    energies = power @ htk_filters(mel.n_fft // 2 + 1, mel.n_mels, mel.sampling_rate)
    log_spec = np.log10(np.maximum(energies, np.float32(1e-10)))
    log_spec = np.maximum(log_spec, log_spec.max() - np.float32(8.0))
    return (log_spec / np.float32(4.0) + np.float32(1.0)).astype(np.float32)


def input_features(samples: np.ndarray, mel: GraniteSpeechMelSettings) -> np.ndarray:
    """`[frames // 2, 2 x n_mels]`: the extractor's `input_features` for one clip."""
    frames = log_mel_frames(samples, mel)
    even = frames.shape[0] // 2 * 2
    return np.ascontiguousarray(frames[:even].reshape(even // 2, 2 * mel.n_mels))


def audio_token_count(encoder_frames: int, cfg: GraniteSpeechAudioConfig) -> int:
    """Audio tokens for `encoder_frames` stacked frames: every started projector window gives its queries."""
    return -(-encoder_frames // cfg.window_size) * cfg.queries
