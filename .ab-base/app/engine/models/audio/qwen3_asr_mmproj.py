"""Qwen3-ASR's audio side from a llama.cpp mmproj GGUF (projector type `qwen3a`), as llama.cpp's
convert_hf_to_gguf.py writes it (Qwen3ASRMmprojModel, a Qwen3-Omni audio tower without vision): the sizes
from `clip.audio.*` and the tensors' shapes, the tensors renamed to the names qwen3_asr.py reads.

What the converter changes is undone here: the convolutions' biases, written `[C, 1, 1]`, are flat again.
The F16 it forces on every convolution weight (`conv2d*`, `conv_out`) is widened back to float32 (the
values stay F16-rounded): the encoder's products over the convolutions' outputs are float32 ones, as the folder's.
The generated `a.position_embd` sinusoids are not read: qwen3_asr.py computes the same table. What the file
does not say is what llama.cpp's qwen3a graph assumes too: 100-frame chunks (`n_window` 50), and the
feature extractor's defaults; the attention window (`n_window_infer`) is transformers' default, 800 frames
(llama.cpp's qwen3a graph has no window: it attends over all the positions of what it is given at once).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.loader.names import CheckpointError
from app.engine.models.audio.folder_tensors import check_named_shapes
from app.engine.models.audio.mel import MelSettings
from app.engine.models.audio.qwen3_asr_config import Qwen3AsrAudioConfig
from app.engine.models.audio.qwen3_asr_weights import expected_shapes
from app.engine.models.audio.speech_mmproj import (
    audio_layer_norm_eps,
    audio_projector_type,
    audio_size,
    open_speech_mmproj,
)
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import quant_type

PROJECTOR_TYPE = "qwen3a"
N_WINDOW = 50  # llama.cpp's qwen3a graph cuts 100-frame chunks; the file has no key for it
N_WINDOW_INFER = 800  # transformers' encoder default (qwen3_asr_config.py's too): not in the file either
_GLOBAL = {"a.conv_out": "tower.conv_out", "a.post_ln": "tower.ln_post", "mm.a.mlp.1": "projector.linear_1",
           "mm.a.mlp.2": "projector.linear_2"}  # fmt: skip
_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj", "ln1": "self_attn_layer_norm", "ln2": "final_layer_norm",
    "ffn_up": "fc1", "ffn_down": "fc2",
}  # fmt: skip
_NAME = re.compile(
    r"^(?P<stem>a\.blk\.(?P<index>\d+)\.(?P<part>\w+)|a\.conv2d\.(?P<conv>[123])|[\w.]+?)\.(?P<suffix>weight|bias)$"
)


def is_qwen3_asr_mmproj(meta: dict[str, Any]) -> bool:
    return audio_projector_type(meta) == PROJECTOR_TYPE


def qwen3_asr_from_mmproj(
    path: Path, audio_token_id: int
) -> tuple[Qwen3AsrAudioConfig, dict[str, QuantizedTensor]]:
    """The encoder's config and tensors (under qwen3_asr.py's names) from the mmproj at `path`;
    CheckpointError naming the file and the key or tensor that is missing or wrong."""
    file = open_speech_mmproj(path, PROJECTOR_TYPE, "Qwen3-ASR")
    tensors = _renamed(path, file.tensors)
    cfg = _config(path, file.metadata, tensors, audio_token_id)
    check_named_shapes(path, tensors, expected_shapes(cfg), _gguf_name, "lacks", "the clip.audio.* keys need")
    return cfg, tensors


def qwen3_asr_mmproj_config(path: Path, meta: dict[str, Any], stored: dict[str, QuantizedTensor]) -> Qwen3AsrAudioConfig:
    """The encoder's config from the mmproj's header and tensor table alone (will-it-fit reads no tensor data);
    no audio token id (-1): the text GGUF's vocabulary holds it."""
    conv = stored.get("a.conv2d.1.weight")
    return _config(path, meta, {} if conv is None else {"tower.conv2d1.weight": conv}, -1)


def _target(name: str) -> str | None:
    match = _NAME.match(name)
    if match is None:
        return None
    suffix = match["suffix"]
    if match["conv"]:
        return f"tower.conv2d{match['conv']}.{suffix}"
    if match["index"] is not None:
        part = _BLOCK.get(match["part"])
        return None if part is None else f"tower.layers.{match['index']}.{part}.{suffix}"
    stem = _GLOBAL.get(match["stem"])
    return None if stem is None else f"{stem}.{suffix}"


def _gguf_name(target: str) -> str:
    """The mmproj name of one of qwen3_asr.py's tensors (errors name the tensor the file lacks)."""
    stem, suffix = target.rsplit(".", 1)
    if stem.startswith("tower.conv2d"):
        return f"a.conv2d.{stem[-1]}.{suffix}"
    block = re.match(r"tower\.layers\.(\d+)\.(.+)$", stem)
    if block:
        return f"a.blk.{block[1]}.{next(k for k, v in _BLOCK.items() if v == block[2])}.{suffix}"
    return next(k for k, v in _GLOBAL.items() if v == stem) + f".{suffix}"


def _renamed(path: Path, stored: dict[str, QuantizedTensor]) -> dict[str, QuantizedTensor]:
    tensors: dict[str, QuantizedTensor] = {}
    for name, tensor in stored.items():
        if name == "a.position_embd.weight":
            continue  # the converter's sinusoids; qwen3_asr.py computes them
        target = _target(name)
        if target is None:
            raise CheckpointError(f"{path}: tensor {name!r} is not one of Qwen3-ASR's")
        if target.startswith("tower.conv"):  # conv biases [C, 1, 1] -> [C]; F16 weights widened
            values = tensor.dequantize().astype(np.float32)
            values = values.reshape(-1) if target.endswith(".bias") else values
            tensors[target] = QuantizedTensor.from_float(target, values, quant_type("F32"))
        else:
            tensors[target] = QuantizedTensor(target, tensor.qtype, tensor.shape, tensor.data)
    return tensors


def _config(
    path: Path, meta: dict[str, Any], tensors: dict[str, QuantizedTensor], audio_token_id: int
) -> Qwen3AsrAudioConfig:
    def key(name: str) -> int:
        return audio_size(path, meta, name)

    conv = tensors.get("tower.conv2d1.weight")
    if conv is None:
        raise CheckpointError(f"{path}: lacks a.conv2d.1.weight")
    mels = key("num_mel_bins")
    cfg = Qwen3AsrAudioConfig(
        num_mel_bins=mels, num_layers=key("block_count"), num_heads=key("attention.head_count"),
        hidden_size=key("embedding_length"), ffn_size=key("feed_forward_length"), conv_channels=int(conv.shape[0]),
        output_dim=key("projection_dim"), n_window=N_WINDOW, n_window_infer=N_WINDOW_INFER,
        audio_token_id=audio_token_id, mel=MelSettings(feature_size=mels),
        layer_norm_eps=audio_layer_norm_eps(meta, 1e-5),
    )  # fmt: skip
    if cfg.hidden_size % cfg.num_heads:
        raise CheckpointError(
            f"{path}: clip.audio.embedding_length {cfg.hidden_size} is not a multiple of "
            f"clip.audio.attention.head_count {cfg.num_heads}"
        )
    return cfg
