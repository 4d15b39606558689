"""Gemma 4's audio side as a Hugging Face folder gives it: the tower's sizes (config.json's
`audio_config`), the audio tokens' ids, the feature extractor's settings (either processor layout),
and the tower's and embedder's tensors (`model.audio_tower.*`, `model.embed_audio.*`, kept as
`tower.*` / `embedder.*`), checked against the config."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.loader.processor_config import read_processor_settings
from app.engine.models.audio.folder_tensors import Tensors, check_shapes, tensors_by_prefix

_PREFIXES = {"audio_tower.": "tower.", "embed_audio.": "embedder."}
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh")
# Gemma4AudioFeatureExtractor's `max_length` (30 s at 16 kHz): longer clips it truncates, we refuse
MAX_SAMPLES = 480_000


@dataclass(frozen=True)
class Gemma4MelSettings:
    """Gemma4AudioFeatureExtractor's settings (defaults as transformers 5.24 has them)."""

    feature_size: int = 128
    sampling_rate: int = 16_000
    frame_length: int = 320  # samples: round(sampling_rate * frame_length_ms / 1000)
    hop_length: int = 160
    min_frequency: float = 0.0
    max_frequency: float = 8000.0
    preemphasis: float = 0.0
    preemphasis_htk_flavor: bool = True
    fft_overdrive: bool = False
    input_scale_factor: float = 1.0
    mel_floor: float = 1e-3
    per_bin_mean: tuple[float, ...] | None = None
    per_bin_stddev: tuple[float, ...] | None = None

    @property
    def fft_length(self) -> int:
        length = 2 ** math.ceil(math.log2(self.frame_length))
        return 2 * length if self.fft_overdrive else length


@dataclass(frozen=True)
class Gemma4AudioConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    conv_channels: tuple[int, int]  # the two subsampling convolutions' output channels
    conv_kernel_size: int  # the light convolution's causal depthwise kernel
    chunk_size: int  # attention_chunk_size: queries attend in blocks of this many positions
    context_left: int  # attention_context_left: a query sees itself and context_left - 2 positions back
    context_right: int
    logit_cap: float
    invalid_logit: float  # attention_invalid_logits_value: the logit of a masked key
    residual_weight: float
    gradient_clipping: float
    clipped_linears: bool  # ClippedLinear's switch (vision's gemma4_vision.ClippedLinear reads it)
    rms_norm_eps: float
    activation: str
    output_dim: int  # output_proj_dims: the tower's output width, the embedder's input
    text_hidden_size: int
    audio_token_id: int
    boa_token_id: int | None
    eoa_token_id: int | None
    mel: Gemma4MelSettings
    max_samples: int = MAX_SAMPLES

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def context_size(self) -> int:
        """Keys a block of queries reads: the block, its left context and its right context."""
        return self.chunk_size + self.context_left - 1 + self.context_right


def has_gemma4_audio(hf_config: dict[str, Any]) -> bool:
    return hf_config.get("model_type") == "gemma4" and isinstance(hf_config.get("audio_config"), dict)


def gemma4_audio_config(folder: Path, hf_config: dict[str, Any]) -> Gemma4AudioConfig:
    """The audio config of a Gemma 4 folder with `audio_config`; CheckpointError naming the file and key."""
    where = folder / "config.json"
    audio = hf_config["audio_config"]
    text = hf_config.get("text_config") or {}

    def value(source: dict[str, Any], key: str, default: Any, kind: type, prefix: str) -> Any:
        found = source.get(key, default)
        good = (
            isinstance(found, kind) and not isinstance(found, bool)
            if kind is not bool
            else isinstance(found, bool)
        )
        if kind is float and isinstance(found, int) and not isinstance(found, bool):
            found, good = float(found), True
        if not good or (kind is int and found <= 0):
            raise CheckpointError(
                f"{where}: {prefix}{key} is {found!r}, not a {'positive ' * (kind is int)}{kind.__name__}"
            )
        return found

    def a(key: str, default: Any, kind: type = int) -> Any:
        return value(audio, key, default, kind, "audio_config.")

    channels = audio.get("subsampling_conv_channels", [128, 32])
    if not (
        isinstance(channels, list)
        and len(channels) == 2
        and all(isinstance(c, int) and c > 0 for c in channels)
    ):
        raise CheckpointError(
            f"{where}: audio_config.subsampling_conv_channels is {channels!r}, not two sizes"
        )
    activation = a("hidden_act", "silu", str)
    if activation not in ACTIVATIONS:
        raise CheckpointError(
            f"{where}: audio_config.hidden_act {activation!r} is not one of {', '.join(ACTIVATIONS)}"
        )
    cfg = Gemma4AudioConfig(
        hidden_size=a("hidden_size", 1024), num_layers=a("num_hidden_layers", 12),
        num_heads=a("num_attention_heads", 8), conv_channels=(channels[0], channels[1]),
        conv_kernel_size=a("conv_kernel_size", 5), chunk_size=a("attention_chunk_size", 12),
        context_left=a("attention_context_left", 13), context_right=int(audio.get("attention_context_right", 0)),
        logit_cap=a("attention_logit_cap", 50.0, float), invalid_logit=a("attention_invalid_logits_value", -1e9, float),
        residual_weight=a("residual_weight", 0.5, float), gradient_clipping=a("gradient_clipping", 1e10, float),
        clipped_linears=a("use_clipped_linears", True, bool), rms_norm_eps=a("rms_norm_eps", 1e-6, float),
        activation=activation, output_dim=a("output_proj_dims", 1536),
        text_hidden_size=value(text, "hidden_size", None, int, "text_config."),
        audio_token_id=value(hf_config, "audio_token_id", 258_881, int, ""),
        boa_token_id=hf_config.get("boa_token_id"), eoa_token_id=hf_config.get("eoa_token_index"),
        mel=_mel_settings(folder),
    )  # fmt: skip
    if cfg.hidden_size % cfg.num_heads or cfg.context_right < 0:
        raise CheckpointError(
            f"{where}: audio_config.hidden_size {cfg.hidden_size} must be a multiple of the {cfg.num_heads} heads "
            f"and attention_context_right ({cfg.context_right}) at least 0"
        )
    if cfg.mel.feature_size != cfg.conv_channels[0]:
        # the projection after the convolutions reads (channels[0] // 4) * channels[1] inputs: the mel
        # bins, a quarter as many after two stride-2 convolutions, times channels[1]
        raise CheckpointError(
            f"{folder}: the feature extractor's {cfg.mel.feature_size} mel bins differ from "
            f"audio_config.subsampling_conv_channels[0] {cfg.conv_channels[0]}, which the tower's projection assumes"
        )
    return cfg


def _mel_settings(folder: Path) -> Gemma4MelSettings:
    settings = read_processor_settings(folder, "feature_extractor")
    values = settings.values
    defaults = Gemma4MelSettings()

    def number(key: str, default: float) -> float:
        found = values.get(key, default)
        if isinstance(found, bool) or not isinstance(found, int | float) or found < 0:
            raise CheckpointError(f"{folder}: {settings.source} {key} is {found!r}, not a number >= 0")
        return found

    def per_bin(key: str) -> tuple[float, ...] | None:
        found = values.get(key)
        if found is None:
            return None
        if not isinstance(found, list) or len(found) != int(number("feature_size", 128)):
            raise CheckpointError(f"{folder}: {settings.source} {key} is not one number per mel bin")
        return tuple(float(x) for x in found)

    rate = int(number("sampling_rate", defaults.sampling_rate))
    frame = values.get("frame_length") or round(rate * number("frame_length_ms", 20.0) / 1000)
    hop = values.get("hop_length") or round(rate * number("hop_length_ms", 10.0) / 1000)
    mel = Gemma4MelSettings(
        feature_size=int(number("feature_size", 128)), sampling_rate=rate, frame_length=int(frame),
        hop_length=int(hop), min_frequency=number("min_frequency", 0.0), max_frequency=number("max_frequency", 8000.0),
        preemphasis=number("preemphasis", 0.0), preemphasis_htk_flavor=bool(values.get("preemphasis_htk_flavor", True)),
        fft_overdrive=bool(values.get("fft_overdrive", False)), input_scale_factor=number("input_scale_factor", 1.0),
        mel_floor=number("mel_floor", 1e-3), per_bin_mean=per_bin("per_bin_mean"), per_bin_stddev=per_bin("per_bin_stddev"),
    )  # fmt: skip
    if rate != 16_000 or mel.frame_length < 2 or mel.hop_length < 1:
        raise CheckpointError(
            f"{folder}: {settings.source} gives {rate} Hz, frames of {mel.frame_length} and hops of "
            f"{mel.hop_length} samples; Gemma 4 audio takes 16 kHz, frames of 2 samples or more"
        )
    return mel


def load_gemma4_audio(folder: Path, cfg: Gemma4AudioConfig) -> Tensors:
    """The tower's and embedder's tensors, checked against `cfg` (CheckpointError naming the tensor)."""
    tensors = tensors_by_prefix(folder, _PREFIXES)
    check_shapes(folder, tensors, expected_shapes(cfg), _PREFIXES, "Gemma 4 audio tower")
    return tensors


def expected_shapes(c: Gemma4AudioConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the tower and embedder read, with its shape (clipping bounds are one number each)."""
    d, (c0, c1) = c.hidden_size, c.conv_channels
    s = "tower.subsample_conv_projection"
    shapes: dict[str, tuple[int, ...]] = {
        f"{s}.layer0.conv.weight": (c0, 1, 3, 3), f"{s}.layer0.norm.weight": (c0,),
        f"{s}.layer1.conv.weight": (c1, c0, 3, 3), f"{s}.layer1.norm.weight": (c1,),
        f"{s}.input_proj_linear.weight": (d, (c0 // 4) * c1),
        "tower.output_proj.weight": (c.output_dim, d), "tower.output_proj.bias": (c.output_dim,),
        "embedder.embedding_projection.weight": (c.text_hidden_size, c.output_dim),
    }  # fmt: skip

    def clipped(name: str, out: int, inp: int) -> None:
        shapes[f"{name}.linear.weight"] = (out, inp)
        if c.clipped_linears:
            for bound in ("input_min", "input_max", "output_min", "output_max"):
                shapes[f"{name}.{bound}"] = (1,)

    for i in range(c.num_layers):
        p = f"tower.layers.{i}"
        for ff in ("feed_forward1", "feed_forward2"):
            clipped(f"{p}.{ff}.ffw_layer_1", 4 * d, d)
            clipped(f"{p}.{ff}.ffw_layer_2", d, 4 * d)
            shapes[f"{p}.{ff}.pre_layer_norm.weight"] = shapes[f"{p}.{ff}.post_layer_norm.weight"] = (d,)
        for proj in ("q_proj", "k_proj", "v_proj", "post"):
            clipped(f"{p}.self_attn.{proj}", d, d)
        shapes[f"{p}.self_attn.relative_k_proj.weight"] = (d, d)
        shapes[f"{p}.self_attn.per_dim_scale"] = (c.head_dim,)
        clipped(f"{p}.lconv1d.linear_start", 2 * d, d)
        clipped(f"{p}.lconv1d.linear_end", d, d)
        shapes[f"{p}.lconv1d.depthwise_conv1d.weight"] = (d, 1, c.conv_kernel_size)
        for norm in (
            "lconv1d.pre_layer_norm",
            "lconv1d.conv_norm",
            "norm_pre_attn",
            "norm_post_attn",
            "norm_out",
        ):
            shapes[f"{p}.{norm}.weight"] = (d,)
    return shapes
