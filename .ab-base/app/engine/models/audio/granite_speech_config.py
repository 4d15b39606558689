"""Granite Speech's audio side as config.json and the feature extractor's settings give it: the conformer
encoder's sizes (`encoder_config`), the Q-Former projector's (`projector_config`), the projector's window
and downsampling, the audio token's id, and the log-mel settings (either processor layout)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.loader.processor_config import read_processor_settings
from app.engine.models.config import positive_integer

ARCHITECTURE = "GraniteSpeechForConditionalGeneration"
MODEL_TYPE = "granite_speech"


@dataclass(frozen=True)
class GraniteSpeechMelSettings:
    """GraniteSpeechFeatureExtractor's torchaudio MelSpectrogram: a `win_length` Hann window centred in
    `n_fft`, HTK mel filters without normalisation, `n_mels` bins; pairs of frames are stacked."""

    sampling_rate: int = 16_000
    n_fft: int = 512
    win_length: int = 400
    hop_length: int = 160
    n_mels: int = 80


@dataclass(frozen=True)
class GraniteSpeechAudioConfig:
    input_dim: int  # two stacked mel frames: 2 x n_mels
    num_layers: int
    hidden_size: int  # the conformer's hidden_dim
    num_heads: int
    head_dim: int
    ff_size: int  # hidden_dim x feedforward_mult
    ctc_size: int  # output_dim: the middle layer's CTC classes, fed back through a softmax
    context_size: int  # frames attending to each other in one block
    max_pos_emb: int  # relative distances -max..max have an embedding each
    conv_kernel_size: int
    conv_size: int  # hidden_dim x conv_expansion_factor
    q_hidden: int  # the Q-Former's width
    q_layers: int
    q_heads: int
    q_ff: int
    q_cross_every: int  # cross_attention_frequency: layers 0, k, 2k... attend to the audio
    q_layer_norm_eps: float
    window_size: int  # encoder frames a projector window takes
    downsample_rate: int  # window_size / downsample_rate queries (audio tokens) per window
    output_dim: int  # the text model's hidden size
    audio_token_id: int
    mel: GraniteSpeechMelSettings
    # text_config.embedding_multiplier: GraniteModel scales its input embeddings, the audio ones spliced in
    # among them too (the engine's soft tokens join after the token embeddings' scaling)
    text_embedding_scale: float = 1.0
    layer_norm_eps: float = 1e-5  # torch's LayerNorm default, which the conformer uses
    batch_norm_eps: float = 1e-5  # torch's BatchNorm1d default

    @property
    def queries(self) -> int:
        return self.window_size // self.downsample_rate


def is_granite_speech(hf_config: dict[str, Any]) -> bool:
    return ARCHITECTURE in (hf_config.get("architectures") or []) or hf_config.get("model_type") == MODEL_TYPE


def granite_speech_audio_config(folder: Path, hf_config: dict[str, Any]) -> GraniteSpeechAudioConfig:
    """The audio config of a Granite Speech folder; CheckpointError naming the file and key otherwise."""
    source = folder / "config.json"

    def section(key: str) -> dict[str, Any]:
        value = hf_config.get(key)
        if not isinstance(value, dict):
            raise CheckpointError(f"{source}: a Granite Speech config needs a {key} object")
        return value

    def size(values: dict[str, Any], where: str, key: str, default: int | None = None) -> int:
        return positive_integer(values.get(key, default), f"{source}: {where}{key}")

    enc, proj, text = section("encoder_config"), section("projector_config"), section("text_config")
    hidden, heads = (
        size(enc, "encoder_config.", "hidden_dim", 1024),
        size(enc, "encoder_config.", "num_heads", 8),
    )
    head_dim = enc.get("dim_head") or hidden // heads
    top = hf_config
    cfg = GraniteSpeechAudioConfig(
        input_dim=size(enc, "encoder_config.", "input_dim", 160),
        num_layers=size(enc, "encoder_config.", "num_layers", 10),
        hidden_size=hidden, num_heads=heads, head_dim=size({"dim_head": head_dim}, "encoder_config.", "dim_head"),
        ff_size=hidden * size(enc, "encoder_config.", "feedforward_mult", 4),
        ctc_size=size(enc, "encoder_config.", "output_dim", 42),
        context_size=size(enc, "encoder_config.", "context_size", 200),
        max_pos_emb=size(enc, "encoder_config.", "max_pos_emb", 512),
        conv_kernel_size=size(enc, "encoder_config.", "conv_kernel_size", 15),
        conv_size=hidden * size(enc, "encoder_config.", "conv_expansion_factor", 2),
        q_hidden=size(proj, "projector_config.", "hidden_size", 768),
        q_layers=size(proj, "projector_config.", "num_hidden_layers", 12),
        q_heads=size(proj, "projector_config.", "num_attention_heads", 12),
        q_ff=size(proj, "projector_config.", "intermediate_size", 3072),
        q_cross_every=size(proj, "projector_config.", "cross_attention_frequency", 2),
        q_layer_norm_eps=float(proj.get("layer_norm_eps", 1e-12)),
        window_size=size(top, "", "window_size", 15), downsample_rate=size(top, "", "downsample_rate", 5),
        output_dim=size(text, "text_config.", "hidden_size"),
        audio_token_id=_token_id(source, hf_config), mel=_mel_settings(folder),
        text_embedding_scale=_positive(source, text, "embedding_multiplier", 1.0),
    )  # fmt: skip
    _check(source, cfg, enc, proj)
    return cfg


def _check(source: Path, cfg: GraniteSpeechAudioConfig, enc: dict[str, Any], proj: dict[str, Any]) -> None:
    if cfg.context_size > cfg.max_pos_emb:
        raise CheckpointError(
            f"{source}: encoder_config.context_size {cfg.context_size} exceeds max_pos_emb {cfg.max_pos_emb}"
        )
    if cfg.window_size % cfg.downsample_rate:
        raise CheckpointError(
            f"{source}: window_size {cfg.window_size} is not a multiple of downsample_rate {cfg.downsample_rate}"
        )
    if cfg.q_hidden % cfg.q_heads:
        raise CheckpointError(
            f"{source}: projector_config.hidden_size {cfg.q_hidden} is not a multiple of its {cfg.q_heads} heads"
        )
    encoder_width = proj.get("encoder_hidden_size", cfg.hidden_size)
    if encoder_width != cfg.hidden_size:
        raise CheckpointError(
            f"{source}: projector_config.encoder_hidden_size {encoder_width} differs from "
            f"encoder_config.hidden_dim {cfg.hidden_size}"
        )
    if proj.get("hidden_act", "gelu") != "gelu" or proj.get("use_qformer_text_input", False):
        raise CheckpointError(
            f"{source}: projector_config with hidden_act {proj.get('hidden_act')!r} and use_qformer_text_input "
            f"{proj.get('use_qformer_text_input')!r}: only Granite Speech's (gelu, no text input) is supported"
        )
    if cfg.input_dim != 2 * cfg.mel.n_mels:
        raise CheckpointError(
            f"{source}: encoder_config.input_dim {cfg.input_dim} is not two frames of the feature extractor's "
            f"{cfg.mel.n_mels} mel bins"
        )


def _mel_settings(folder: Path) -> GraniteSpeechMelSettings:
    """transformers 5 writes the MelSpectrogram's arguments as `melspec_kwargs`; older files (and the
    extractor's own arguments) have them at the top level, which wins where both are."""
    settings = read_processor_settings(folder, "feature_extractor")
    nested = settings.values.get("melspec_kwargs") or {}
    if not isinstance(nested, dict):
        raise CheckpointError(f"{folder}: {settings.source} melspec_kwargs is not an object")
    values = {**nested, **settings.values}
    if "sample_rate" in nested and "sampling_rate" not in settings.values:
        values["sampling_rate"] = nested["sample_rate"]

    def setting(key: str, default: int) -> int:
        return positive_integer(values.get(key, default), f"{folder}: {settings.source} {key}")

    mel = GraniteSpeechMelSettings(
        sampling_rate=setting("sampling_rate", 16_000), n_fft=setting("n_fft", 512),
        win_length=setting("win_length", 400), hop_length=setting("hop_length", 160), n_mels=setting("n_mels", 80),
    )  # fmt: skip
    if mel.win_length > mel.n_fft:
        raise CheckpointError(
            f"{folder}: {settings.source} win_length {mel.win_length} exceeds n_fft {mel.n_fft}"
        )
    return mel


def _positive(source: Path, text: dict[str, Any], key: str, default: float) -> float:
    value = text.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"{source}: text_config.{key} is {value!r}, not a positive number")
    return float(value)


def _token_id(source: Path, hf_config: dict[str, Any]) -> int:
    value = hf_config.get("audio_token_index", hf_config.get("audio_token_id", 49155))
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CheckpointError(f"{source}: audio_token_index is {value!r}, not a token id")
    return value
