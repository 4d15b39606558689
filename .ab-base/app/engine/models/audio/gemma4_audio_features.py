"""Gemma 4's log-mel front end in numpy, as transformers' Gemma4AudioFeatureExtractor computes it,
and the number of soft tokens a clip becomes.

Unlike Whisper's recipe (mel.py): "semicausal" framing (frame_length // 2 zeros before the clip, no
centring), frames of frame_length + 1 samples of which the first frame_length are windowed (or all,
pre-emphasised), a periodic Hann window, an FFT of the next power of two, the magnitude (not the
power) through an unnormalised HTK-scale mel bank, `log(mel + mel_floor)`, optional per-bin
normalisation. The extractor pads the clip to a multiple of 128 samples and marks, by a frame mask,
the frames whose last sample lies inside the clip; the model keeps those only (the padding frames
are zeroed and their soft tokens dropped), so only they are computed here.
"""

from __future__ import annotations

import numpy as np

from app.engine.models.audio.gemma4_audio_config import Gemma4MelSettings
from app.engine.models.audio.mel import mel_filters

SUBSAMPLING_LAYERS = 2  # stride-2 convolutions over time before the conformer: 4x fewer positions


def valid_frames(num_samples: int, s: Gemma4MelSettings) -> int:
    """Frames whose samples all lie inside a clip of `num_samples` (the extractor's mask)."""
    room = num_samples + s.frame_length // 2 - s.frame_length
    return max(0, -(-room // s.hop_length))


def soft_tokens(frames: int) -> int:
    """Audio soft tokens for `frames` valid mel frames: each stride-2 convolution keeps every other
    position of the mask, as Gemma4Processor.replace_audio_token counts them."""
    for _ in range(SUBSAMPLING_LAYERS):
        frames = (frames + 1) // 2
    return frames


def gemma4_log_mel(samples: np.ndarray, s: Gemma4MelSettings) -> np.ndarray:
    """Mono float samples at 16 kHz -> `[frames, feature_size]` float32 log-mel of the valid frames."""
    x = np.asarray(samples, np.float32).reshape(-1)
    if s.input_scale_factor != 1.0:
        x = x * np.float32(s.input_scale_factor)
    count = valid_frames(x.size, s)
    if count == 0:
        return np.zeros((0, s.feature_size), np.float32)
    padded = np.pad(x, (s.frame_length // 2, 0))
    size = s.frame_length + 1
    frames = np.lib.stride_tricks.as_strided(
        padded, (count, size), (padded.strides[0] * s.hop_length, padded.strides[0]), writeable=False
    )
    if s.preemphasis > 0.0 and s.preemphasis_htk_flavor:
        p = np.float32(s.preemphasis)
        frames = np.concatenate([frames[:, :1] * (1 - p), frames[:, 1:-1] - p * frames[:, :-2]], axis=-1)
    elif s.preemphasis > 0.0:
        frames = frames[:, 1:] - np.float32(s.preemphasis) * frames[:, :-1]
    else:
        frames = frames[:, :-1]
    window = np.hanning(s.frame_length + 1)[:-1].astype(np.float32)  # periodic
    magnitude = np.abs(np.fft.rfft(frames * window, n=s.fft_length, axis=-1))
    bank = mel_filters(
        s.fft_length // 2 + 1, s.feature_size, s.sampling_rate, "htk", s.min_frequency, s.max_frequency
    )
    log_mel = np.log(magnitude @ bank + np.float64(s.mel_floor))
    if s.per_bin_mean is not None:
        log_mel = log_mel - np.asarray(s.per_bin_mean)
    if s.per_bin_stddev is not None:
        log_mel = log_mel / np.asarray(s.per_bin_stddev)
    return log_mel.astype(np.float32)
