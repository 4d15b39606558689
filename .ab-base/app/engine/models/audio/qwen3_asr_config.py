"""Qwen3-ASR's audio side as config.json and the feature extractor's settings give it: the encoder's
sizes (`audio_config`), the audio token's id, and the mel settings (either processor layout)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.loader.processor_config import read_processor_settings
from app.engine.models.audio.mel import MelSettings
from app.engine.models.config import positive_integer

ARCHITECTURE = "Qwen3ASRForConditionalGeneration"
CONV_LAYERS = 3  # stride-2 convolutions: 8x fewer frames, 8x fewer mel bins


@dataclass(frozen=True)
class Qwen3AsrAudioConfig:
    num_mel_bins: int
    num_layers: int
    num_heads: int
    hidden_size: int  # d_model
    ffn_size: int
    conv_channels: int  # downsample_hidden_size
    output_dim: int  # the projector's output: the text model's hidden size
    n_window: int  # a chunk is 2 * n_window mel frames, convolved on its own
    n_window_infer: int  # mel frames an attention window spans (a whole number of chunks)
    audio_token_id: int
    mel: MelSettings
    layer_norm_eps: float = 1e-5  # torch's LayerNorm default, which the encoder uses

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def chunk_frames(self) -> int:
        return 2 * self.n_window

    @property
    def conv_freq_bins(self) -> int:
        bins = self.num_mel_bins
        for _ in range(CONV_LAYERS):
            bins = (bins + 1) // 2
        return bins


def is_qwen3_asr(hf_config: dict[str, Any]) -> bool:
    return (
        ARCHITECTURE in (hf_config.get("architectures") or []) or hf_config.get("model_type") == "qwen3_asr"
    )


def qwen3_asr_audio_config(folder: Path, hf_config: dict[str, Any]) -> Qwen3AsrAudioConfig:
    """The audio config of a Qwen3-ASR folder; CheckpointError naming the file and key otherwise."""
    audio = hf_config.get("audio_config")
    if not isinstance(audio, dict):
        raise CheckpointError(f"{folder / 'config.json'}: a Qwen3-ASR config needs an audio_config object")

    def size(key: str, default: int | None = None) -> int:
        return positive_integer(audio.get(key, default), f"{folder / 'config.json'}: audio_config.{key}")

    settings = read_processor_settings(folder, "feature_extractor")
    values = settings.values

    def setting(key: str, default: int) -> int:
        value = values.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CheckpointError(f"{folder}: {settings.source} {key} is {value!r}, not a whole number")
        return value

    mel = MelSettings(
        feature_size=setting("feature_size", 128), sampling_rate=setting("sampling_rate", 16_000),
        hop_length=setting("hop_length", 160), n_fft=setting("n_fft", 400), min_length=setting("min_length", 8000),
    )  # fmt: skip
    cfg = Qwen3AsrAudioConfig(
        num_mel_bins=size("num_mel_bins", 128), num_layers=size("encoder_layers", 24),
        num_heads=size("encoder_attention_heads", 16), hidden_size=size("d_model", 1024),
        ffn_size=size("encoder_ffn_dim", 4096), conv_channels=size("downsample_hidden_size", 480),
        output_dim=size("output_dim", 3584), n_window=size("n_window", 50),
        n_window_infer=size("n_window_infer", 800), audio_token_id=_token_id(folder, hf_config), mel=mel,
    )  # fmt: skip
    if mel.feature_size != cfg.num_mel_bins:
        raise CheckpointError(
            f"{folder}: {settings.source} feature_size {mel.feature_size} differs from "
            f"config.json audio_config.num_mel_bins {cfg.num_mel_bins}"
        )
    if cfg.n_window_infer % cfg.chunk_frames or cfg.hidden_size % cfg.num_heads:
        raise CheckpointError(
            f"{folder / 'config.json'}: audio_config n_window_infer {cfg.n_window_infer} must be a multiple of "
            f"2 * n_window ({cfg.chunk_frames}) and d_model {cfg.hidden_size} of the {cfg.num_heads} heads"
        )
    return cfg


def _token_id(folder: Path, hf_config: dict[str, Any]) -> int:
    value = hf_config.get("audio_token_id", 151676)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CheckpointError(f"{folder / 'config.json'}: audio_token_id is {value!r}, not a token id")
    return value
