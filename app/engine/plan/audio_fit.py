"""A speech model's audio side in will-it-fit: the encoder and projector weights as stored, the LoRA adapter
its text model takes with audio (Granite Speech's), and the working set to encode a minute of audio.

The audio tensors are found by their names in the safetensors headers, as models/audio loads them:
Granite Speech's `encoder.*` / `projector.*`, Qwen3-ASR's `audio_tower.*` / `multi_modal_projector.*`
(with or without transformers 5's `model.` prefix); beside a text GGUF, Granite Speech's or Qwen3-ASR's
(`qwen3a`) mmproj file. The adapter's A and B matrices are held while they
are merged into the text weights, whose size the merge leaves as it was.

Granite Speech's conformer (models/audio/granite_speech.py) runs over every frame of a clip at once
(50 frames a second): per frame the residual, a normed copy, the feed-forward's up projection, q, k, v
and the attention output, and the convolution module's doubled projection, its GLU, padded copy and
output, all float32; attention scores for `BLOCK_BATCH` blocks of `context_size` frames at a time, with
their relative-position terms and the query's product with every distance's vector (2 x context_size wide). Qwen3-ASR's working set is not estimated (its weights are counted).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLOAT_BYTES = 4
SECONDS = 60  # the activation estimate is for a minute of audio
_GRANITE = ("GraniteSpeechForConditionalGeneration", "granite_speech", ("encoder.", "projector."))
_QWEN3_ASR = ("Qwen3ASRForConditionalGeneration", "qwen3_asr", ("audio_tower.", "multi_modal_projector."))
QWEN3_ASR_PROJECTOR = "qwen3a"  # clip.audio.projector_type of llama.cpp's Qwen3-ASR mmproj
_ADAPTER_PREFIX = "base_model.model."  # PEFT's names in adapter_model.safetensors


@dataclass(frozen=True)
class AudioShape:
    weight_bytes: int  # encoder + projector, as stored
    adapter_bytes: int  # the LoRA adapter's matrices (0 without one)
    activation_bytes: int  # to encode a minute of audio (0: not estimated)
    source: str  # where the audio side's weights are: "<folder>/*.safetensors"
    family: str  # "Granite Speech", "Qwen3-ASR"

    @property
    def total(self) -> int:
        return self.weight_bytes + self.adapter_bytes + self.activation_bytes


def _family(config: Mapping[str, Any]) -> tuple[str, str, tuple[str, ...]] | None:
    for family in (_GRANITE, _QWEN3_ASR):
        architecture, model_type, _ = family
        if architecture in (config.get("architectures") or ()) or config.get("model_type") == model_type:
            return family
    return None


def is_speech_config(config: Mapping[str, Any]) -> bool:
    """config.json of a speech model whose audio side the engine runs (its job: transcription)."""
    return _family(config) is not None


def is_audio_tensor(hf_name: str, config: Mapping[str, Any]) -> bool:
    """A tensor of the audio side (encoder, projector) or of the LoRA adapter, by its name."""
    family = _family(config)
    if family is None:
        return False
    return hf_name.startswith(_ADAPTER_PREFIX) or hf_name.removeprefix("model.").startswith(family[2])


def audio_from_hf_config(config: Mapping[str, Any], tensors: Iterable[tuple[str, int]], source: str) -> AudioShape | None:
    """From config.json and the folder's `(tensor name, bytes)`; None for a model without an audio side."""
    family = _family(config)
    if family is None:
        return None
    weights = adapter = 0
    for name, size in tensors:
        if name.startswith(_ADAPTER_PREFIX):
            adapter += size
        elif is_audio_tensor(name, config):
            weights += size
    granite = family is _GRANITE
    activations = _granite_activation_bytes(config) if granite else 0
    return AudioShape(weights, adapter, activations, source, "Granite Speech" if granite else "Qwen3-ASR")


def audio_beside_gguf(model_path: str | Path) -> AudioShape | None:
    """The audio side llama.cpp pairs with a text GGUF: a Granite Speech or Qwen3-ASR mmproj beside it (header
    and tensor table only), or None."""
    from app.engine.loader.gguf import read_gguf
    from app.engine.plan.vision_fit import mmproj_beside

    found = mmproj_beside(model_path)
    if found is None:
        return None
    file = read_gguf(found)
    meta = file.metadata
    if meta.get("clip.audio.projector_type") == QWEN3_ASR_PROJECTOR:
        return AudioShape(_qwen3_asr_mmproj_bytes(file.tensors), 0, 0, found.name, "Qwen3-ASR")
    if meta.get("clip.projector_type") != "granite_speech":
        return None
    encoder = {"hidden_dim": meta.get("clip.audio.embedding_length", 1024),
               "num_heads": meta.get("clip.audio.attention.head_count", 8),
               "feedforward_mult": int(meta.get("clip.audio.feed_forward_length", 4096))
               // int(meta.get("clip.audio.embedding_length", 1024)),
               "context_size": meta.get("clip.audio.chunk_size", 200)}  # fmt: skip
    weights = sum(t.nbytes for t in file.tensors.values())
    activations = _granite_activation_bytes({"encoder_config": encoder})
    return AudioShape(weights, 0, activations, found.name, "Granite Speech")


def _qwen3_asr_mmproj_bytes(tensors: Mapping[str, Any]) -> int:
    """A `qwen3a` mmproj's tensors as models/audio/qwen3_asr_mmproj.py holds them: the converter's F16
    convolution weights widened to float32, its position sinusoids not read."""
    total = 0
    for name, tensor in tensors.items():
        if name == "a.position_embd.weight":
            continue
        is_conv = name.startswith(("a.conv2d.", "a.conv_out."))
        total += FLOAT_BYTES * math.prod(tensor.shape) if is_conv else tensor.nbytes
    return total


def _granite_activation_bytes(config: Mapping[str, Any]) -> int:
    """A minute of audio through the conformer (the module docstring's count), GraniteSpeechEncoderConfig's
    defaults for what the config leaves out; the Q-Former over the same frames is far smaller."""
    from app.engine.models.audio.granite_speech import BLOCK_BATCH

    enc = config.get("encoder_config") or {}
    hidden = int(enc.get("hidden_dim", 1024))
    heads = int(enc.get("num_heads", 8))
    inner = heads * int(enc.get("dim_head") or hidden // heads)
    ff = hidden * int(enc.get("feedforward_mult", 4))
    conv = hidden * int(enc.get("conv_expansion_factor", 2))
    context = int(enc.get("context_size", 200))
    frames = SECONDS * 50
    per_frame = 2 * hidden + ff + 4 * inner + 5 * conv
    blocks = min(BLOCK_BATCH, -(-frames // context))
    scores = 4 * blocks * heads * context * context  # scores, position terms, query . every distance (2 c)
    return (frames * per_frame + scores) * FLOAT_BYTES
