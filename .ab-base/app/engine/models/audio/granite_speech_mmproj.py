"""Granite Speech's audio side from a llama.cpp mmproj GGUF (`clip.projector_type` granite_speech), as
llama.cpp's convert_hf_to_gguf.py writes it (GraniteSpeechMmprojModel): the sizes from `clip.audio.*` and
the tensors' shapes, the tensors renamed to the Hugging Face names granite_speech.py reads.

The converter splits each block's `to_kv` into `attn_k` / `attn_v` (joined back here, keys first), squeezes
the pointwise and depthwise kernels to 2D (given back their unit axis), and folds BatchNorm's statistics into
a scale and a shift (`conv_norm_var`, kept as `batch_norm.scale` / `.shift`). What the file does not say is
what llama.cpp assumes too: the Q-Former's LayerNorm epsilon 1e-12, and the feature extractor's defaults
(a 512-point FFT of 400-sample windows every 160 samples at 16 kHz), its mel bins half the input width.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.loader.names import CheckpointError
from app.engine.models.audio.granite_speech_config import GraniteSpeechAudioConfig, GraniteSpeechMelSettings
from app.engine.models.audio.granite_speech_weights import check_shapes
from app.engine.models.audio.speech_mmproj import (
    audio_layer_norm_eps,
    audio_projector_type,
    audio_size,
    open_speech_mmproj,
)
from app.engine.quant.dispatch import QuantizedTensor

PROJECTOR_TYPE = "granite_speech"
QFORMER_EPS = 1e-12  # llama.cpp's proj_eps: the converter writes no key for it
_RENAMES = {
    "a.input_projection": "encoder.input_linear",
    "a.enc_ctc_out": "encoder.out",
    "a.enc_ctc_out_mid": "encoder.out_mid",
    "a.proj_query": "projector.query",
    "a.proj_norm": "projector.qformer.layernorm",
    "a.proj_linear": "projector.linear",
}
_BLOCK = {
    "ffn_norm": "ff1.pre_norm", "ffn_up": "ff1.up_proj", "ffn_down": "ff1.down_proj",
    "ffn_norm_1": "ff2.pre_norm", "ffn_up_1": "ff2.up_proj", "ffn_down_1": "ff2.down_proj",
    "ln1": "attn.pre_norm", "attn_q": "attn.to_q", "attn_out": "attn.to_out", "attn_rel_pos_emb": "attn.rel_pos_emb",
    "norm_conv": "conv.norm", "conv_pw1": "conv.up_conv", "conv_dw": "conv.depth_conv.conv",
    "conv_pw2": "conv.down_conv", "ln2": "post_norm",
}  # fmt: skip
_QFORMER = {
    "self_attn_q": "attention.attention.query", "self_attn_k": "attention.attention.key",
    "self_attn_v": "attention.attention.value", "self_attn_out": "attention.output.dense",
    "self_attn_norm": "attention.output.LayerNorm",
    "cross_attn_q": "crossattention.attention.query", "cross_attn_k": "crossattention.attention.key",
    "cross_attn_v": "crossattention.attention.value", "cross_attn_out": "crossattention.output.dense",
    "cross_attn_norm": "crossattention.output.LayerNorm",
    "ffn_up": "intermediate_query.dense", "ffn_down": "output_query.dense", "ffn_norm": "output_query.LayerNorm",
}  # fmt: skip
_NAME = re.compile(r"^a\.(?:(?P<kind>blk|proj_blk)\.(?P<index>\d+)\.)?(?P<part>\w+?)(?:\.(?P<suffix>weight|bias))?$")


def is_granite_speech_mmproj(meta: dict[str, Any]) -> bool:
    return audio_projector_type(meta) == PROJECTOR_TYPE


def granite_speech_from_mmproj(
    path: Path, output_dim: int, audio_token_id: int, text_embedding_scale: float
) -> tuple[GraniteSpeechAudioConfig, dict[str, QuantizedTensor]]:
    """The encoder's config and tensors (under granite_speech.py's names) from the mmproj at `path`;
    CheckpointError naming the file and the key or tensor that is missing or wrong."""
    file = open_speech_mmproj(path, PROJECTOR_TYPE, "Granite Speech")
    tensors = _renamed(path, file.tensors)
    cfg = _config(path, file.metadata, tensors, output_dim, audio_token_id, text_embedding_scale)
    check_shapes(path, tensors, cfg, folded=True)
    return cfg, tensors


def _renamed(path: Path, stored: dict[str, QuantizedTensor]) -> dict[str, QuantizedTensor]:
    tensors: dict[str, QuantizedTensor] = {}
    keys: dict[int, dict[str, QuantizedTensor]] = {}
    for name, tensor in stored.items():
        match = _NAME.match(name)
        if match is None:
            raise CheckpointError(f"{path}: tensor {name!r} is not one of Granite Speech's")
        kind, index, part, suffix = match["kind"], match["index"], match["part"], match["suffix"]
        tail = f".{suffix}" if suffix else ".weight"
        if kind == "blk" and part in ("attn_k", "attn_v"):
            keys.setdefault(int(index), {})[part] = tensor
            continue
        if kind == "blk" and part == "conv_norm_var":
            target = f"encoder.layers.{index}.conv.batch_norm.{'scale' if suffix == 'weight' else 'shift'}"
        elif kind == "blk" and part in _BLOCK:
            target = f"encoder.layers.{index}.{_BLOCK[part]}{tail}"
        elif kind == "proj_blk" and part in _QFORMER:
            target = f"projector.qformer.encoder.layer.{index}.{_QFORMER[part]}{tail}"
        elif kind is None and f"a.{part}" in _RENAMES:
            target = _RENAMES[f"a.{part}"] + ("" if part == "proj_query" else tail)
        else:
            raise CheckpointError(f"{path}: tensor {name!r} is not one of Granite Speech's")
        values = tensor.dequantize()
        if part in ("conv_pw1", "conv_pw2") and suffix == "weight":
            values = values[:, :, None]
        elif part == "conv_dw":
            values = values[:, None, :]
        tensors[target] = QuantizedTensor.from_float(target, values, tensor.qtype) if values.ndim > 2 else tensor
    for index, pair in keys.items():
        if set(pair) != {"attn_k", "attn_v"}:
            raise CheckpointError(f"{path}: a.blk.{index} has {next(iter(pair))} without its pair")
        joined = np.concatenate([pair["attn_k"].dequantize(), pair["attn_v"].dequantize()], axis=0)
        name = f"encoder.layers.{index}.attn.to_kv.weight"
        tensors[name] = QuantizedTensor.from_float(name, joined, pair["attn_k"].qtype)
    return tensors


def _config(
    path: Path, meta: dict[str, Any], tensors: dict[str, QuantizedTensor], output_dim: int, audio_token_id: int,
    embedding_scale: float,
) -> GraniteSpeechAudioConfig:  # fmt: skip
    def key(name: str) -> int:
        return audio_size(path, meta, name)

    def shape(name: str) -> tuple[int, ...]:
        found = tensors.get(name)
        if found is None:
            raise CheckpointError(f"{path}: lacks the tensor that becomes {name}")
        return tuple(found.shape)

    q_layers = sorted({int(n.split(".")[4]) for n in tensors if n.startswith("projector.qformer.encoder.layer.")})
    crossing = [i for i in q_layers if f"projector.qformer.encoder.layer.{i}.crossattention.output.dense.weight" in tensors]
    every = crossing[1] - crossing[0] if len(crossing) > 1 else max(len(q_layers), 1)
    mels = key("num_mel_bins")
    return GraniteSpeechAudioConfig(
        input_dim=mels, num_layers=key("block_count"), hidden_size=key("embedding_length"),
        num_heads=key("attention.head_count"), head_dim=shape("encoder.layers.0.attn.rel_pos_emb.weight")[1],
        ff_size=key("feed_forward_length"), ctc_size=shape("encoder.out.weight")[0],
        context_size=key("chunk_size"), max_pos_emb=key("max_pos_emb"), conv_kernel_size=key("conv_kernel_size"),
        conv_size=shape("encoder.layers.0.conv.depth_conv.conv.weight")[0],
        q_hidden=shape("projector.query")[-1], q_layers=len(q_layers), q_heads=key("projector.head_count"),
        q_ff=shape("projector.qformer.encoder.layer.0.intermediate_query.dense.weight")[0], q_cross_every=every,
        q_layer_norm_eps=QFORMER_EPS, window_size=key("projector.window_size"),
        downsample_rate=key("projector.downsample_rate"), output_dim=output_dim, audio_token_id=audio_token_id,
        mel=GraniteSpeechMelSettings(n_mels=mels // 2), text_embedding_scale=embedding_scale,
        layer_norm_eps=audio_layer_norm_eps(meta, 1e-5),
    )  # fmt: skip
