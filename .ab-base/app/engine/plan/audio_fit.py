"""A model's audio side in will-it-fit: the encoder (tower) and projector weights as stored, the LoRA adapter
its text model takes with audio (Granite Speech's), and the working set to encode a clip.

Two kinds of model have one. A speech model (its job: transcription): Granite Speech's `encoder.*` /
`projector.*`, Qwen3-ASR's `audio_tower.*` / `multi_modal_projector.*` (with or without transformers 5's
`model.` prefix), or beside a text GGUF Granite Speech's or Qwen3-ASR's (`qwen3a`: its F16 convolutions
counted widened to float32, as models/audio/qwen3_asr_mmproj.py holds them; its working set from the header's
sizes) mmproj file. And a chat model that also takes audio: a Gemma 4 folder whose config.json has an audio_config (models/audio/gemma4_audio*.py), its `audio_tower.*` /
`embed_audio.*` tensors, or a Gemma 4 GGUF's mmproj with an audio half (projector "gemma4a"), its `a.*` /
`mm.a.*` tensors. The tensors are found by their names in the safetensors headers, as models/audio loads
them. The adapter's A and B matrices are held while they are merged into the text weights, whose size the
merge leaves as it was.

Granite Speech's conformer (models/audio/granite_speech.py) runs over every frame of a clip at once
(50 frames a second), sized for a minute of audio: per frame the residual, a normed copy, the feed-forward's
up projection, q, k, v and the attention output, and the convolution module's doubled projection, its GLU,
padded copy and output, all float32; attention scores for `BLOCK_BATCH` blocks of `context_size` frames at a
time, with their relative-position terms and the query's product with every distance's vector (2 x
context_size wide).

Qwen3-ASR's encoder (models/audio/qwen3_asr.py) runs in three stages, one after the other, so its working set
is the largest of them, sized for the longest clip its task model's context holds (`ASR_CONTEXT` tokens, one
soft token per encoder position): the convolutions, CONV_CHUNKS chunks at a time (the second one gathers
channels x 9 taps for each of its output positions, a quarter of the mel bins by a quarter of the chunk's
frames, and the product takes a transposed copy: 2 x chunks x channels x 9 x positions floats); each encoder
layer over all of the clip's positions (6 x d_model and 2 x ffn floats per position) beside one batch of
WINDOW_BATCH windows' scores (heads x window^2 each); the projector's two layers (well under the above).

Gemma 4's working set, sized at its feature extractor's 30 s (3,000 frames), peaks in the subsampling
convolutions, each a product over gathered 3x3 patches (models/audio/qwen3_asr.Conv3x3): the first
convolution's output (channels[0] x frames/2 x bins/2) and its LayerNorm's temporaries, or that output and
its padded copy beside the second's patches (frames/4 x bins/4 x channels[0] x 9) and output; measured with
tracemalloc in the tests. The conformer after it holds a few `[tokens, 4 x hidden]` rows and block-local
attention logits, far less.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLOAT_BYTES = 4
SECONDS = 60  # Granite Speech's activation estimate is for a minute of audio
ASR_CONTEXT = 8192  # a speech model's context, prompt + reply: 13 audio tokens a second, about eight minutes
GEMMA4_MAX_SECONDS = 30  # Gemma4AudioFeatureExtractor's max_length: 480,000 samples at 16 kHz
GEMMA4_FRAMES_PER_SECOND = 100  # 10 ms hops
_GRANITE = ("GraniteSpeechForConditionalGeneration", "granite_speech", ("encoder.", "projector."))
_QWEN3_ASR = ("Qwen3ASRForConditionalGeneration", "qwen3_asr", ("audio_tower.", "multi_modal_projector."))
_GEMMA4_PREFIXES = ("audio_tower.", "embed_audio.")
_ADAPTER_PREFIX = "base_model.model."  # PEFT's names in adapter_model.safetensors


@dataclass(frozen=True)
class AudioShape:
    weight_bytes: int  # encoder (tower) + projector, as stored
    adapter_bytes: int  # the LoRA adapter's matrices (0 without one)
    activation_bytes: int  # to encode a `clip` of audio (0: not estimated)
    source: str  # where the audio side's weights are: "<folder>/*.safetensors", the mmproj's name
    family: str  # "Granite Speech", "Qwen3-ASR", "Gemma 4"
    # what the activation estimate encodes: "minute of audio", "30 s clip", "clip of 8,192 tokens"
    clip: str = "minute of audio"

    @property
    def total(self) -> int:
        return self.weight_bytes + self.adapter_bytes + self.activation_bytes


def _family(config: Mapping[str, Any]) -> tuple[str, str, tuple[str, ...]] | None:
    for family in (_GRANITE, _QWEN3_ASR):
        architecture, model_type, _ = family
        if architecture in (config.get("architectures") or ()) or config.get("model_type") == model_type:
            return family
    return None


def _gemma4_with_audio(config: Mapping[str, Any]) -> bool:
    """A Gemma 4 config.json whose audio tower the engine loads beside the chat model."""
    return config.get("model_type") == "gemma4" and isinstance(config.get("audio_config"), Mapping)


def is_speech_config(config: Mapping[str, Any]) -> bool:
    """config.json of a speech model whose audio side the engine runs (its job: transcription)."""
    return _family(config) is not None


def is_audio_tensor(hf_name: str, config: Mapping[str, Any]) -> bool:
    """A tensor of the audio side (encoder, projector) or of a speech model's LoRA adapter, by its name."""
    family = _family(config)
    if family is not None:
        return hf_name.startswith(_ADAPTER_PREFIX) or hf_name.removeprefix("model.").startswith(family[2])
    return _gemma4_with_audio(config) and hf_name.removeprefix("model.").startswith(_GEMMA4_PREFIXES)


def is_audio_gguf_tensor(name: str) -> bool:
    """An mmproj GGUF's tensor of the audio half (llama.cpp's `a.*` tower, `mm.a.*` projector)."""
    return name.startswith(("a.", "mm.a."))


def audio_from_hf_config(
    config: Mapping[str, Any],
    tensors: Iterable[tuple[str, int]],
    source: str,
    folder: Path | None = None,
    context: int = ASR_CONTEXT,
) -> AudioShape | None:
    """From config.json and the folder's `(tensor name, bytes)`; None for a model without an audio side.
    Qwen3-ASR's working set needs its `folder` (the feature extractor's settings) and is sized for clips of
    up to `context` tokens; without the folder it is not estimated."""
    family = _family(config)
    if family is None and not _gemma4_with_audio(config):
        return None
    weights = adapter = 0
    for name, size in tensors:
        if family is not None and name.startswith(_ADAPTER_PREFIX):
            adapter += size
        elif is_audio_tensor(name, config):
            weights += size
    if family is None:  # Gemma 4 (transformers' defaults for what its audio_config leaves out)
        audio = config["audio_config"]
        channels = audio.get("subsampling_conv_channels") or (128, 32)
        # the tower's projection takes channels[0] // 4 bins: as many mel bins as channels[0]
        activations = _gemma4_activation_bytes(int(audio.get("hidden_size", 1024)), int(channels[0]),
                                               (int(channels[0]), int(channels[1])))  # fmt: skip
        return AudioShape(weights, 0, activations, source, "Gemma 4", "30 s clip")
    if family is _GRANITE:
        return AudioShape(weights, adapter, _granite_activation_bytes(config), source, "Granite Speech")
    activations = 0 if folder is None else _qwen3_asr_activation_bytes(folder, config, context)
    return AudioShape(weights, adapter, activations, source, "Qwen3-ASR", f"clip of {context:,} tokens")


def audio_beside_gguf(model_path: str | Path, architecture: str | None = None) -> AudioShape | None:
    """The audio side the engine would load beside a text GGUF (header and tensor table only): a Granite
    Speech or Qwen3-ASR mmproj beside it, or a Gemma 4 GGUF's mmproj with an audio half; None otherwise."""
    from app.engine.loader.gguf import read_gguf
    from app.engine.models.audio.gemma4_audio_mmproj import is_gemma4_audio_mmproj
    from app.engine.models.audio.granite_speech_mmproj import is_granite_speech_mmproj
    from app.engine.models.audio.qwen3_asr_mmproj import is_qwen3_asr_mmproj, qwen3_asr_mmproj_config
    from app.engine.models.vision.weights import find_mmproj  # the loader's rule (vision_fit.py imports this)

    found = find_mmproj(Path(model_path))
    if found is None:
        return None
    file = read_gguf(found)
    meta = file.metadata
    if is_qwen3_asr_mmproj(meta):  # the loader's rules (models/audio/speech_mmproj.py)
        activations = qwen3_asr_activation_bytes(qwen3_asr_mmproj_config(found, meta, file.tensors), ASR_CONTEXT)
        return AudioShape(_qwen3_asr_mmproj_bytes(file.tensors), 0, activations, found.name, "Qwen3-ASR",
                          f"clip of {ASR_CONTEXT:,} tokens")  # fmt: skip
    if is_granite_speech_mmproj(meta):
        encoder = {"hidden_dim": meta.get("clip.audio.embedding_length", 1024),
                   "num_heads": meta.get("clip.audio.attention.head_count", 8),
                   "feedforward_mult": int(meta.get("clip.audio.feed_forward_length", 4096))
                   // int(meta.get("clip.audio.embedding_length", 1024)),
                   "context_size": meta.get("clip.audio.chunk_size", 200)}  # fmt: skip
        weights = sum(t.nbytes for t in file.tensors.values())
        activations = _granite_activation_bytes({"encoder_config": encoder})
        return AudioShape(weights, 0, activations, found.name, "Granite Speech")
    if architecture != "gemma4" or not is_gemma4_audio_mmproj(meta):
        return None
    convs = [file.tensors.get(f"a.conv1d.{i}.weight") for i in (0, 1)]
    if convs[0] is None or convs[1] is None or "clip.audio.embedding_length" not in meta:
        raise ValueError(f"{found.name} lacks its audio tower's convolutions or size: cannot size it")
    c0, c1 = convs[0].shape[0], convs[1].shape[0]
    weights = sum(t.nbytes for name, t in file.tensors.items() if is_audio_gguf_tensor(name))
    activations = _gemma4_activation_bytes(int(meta["clip.audio.embedding_length"]), c0, (c0, c1))
    return AudioShape(weights, 0, activations, found.name, "Gemma 4", "30 s clip")


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


def _qwen3_asr_activation_bytes(folder: Path, config: Mapping[str, Any], context: int) -> int:
    from app.engine.models.audio.qwen3_asr_config import qwen3_asr_audio_config

    return qwen3_asr_activation_bytes(qwen3_asr_audio_config(folder, dict(config)), context)


def qwen3_asr_activation_bytes(cfg: Any, context: int) -> int:
    """Qwen3-ASR's encoder (its Qwen3AsrAudioConfig `cfg`, from a folder or an mmproj's header) on a clip of
    `context` positions (the module docstring's count)."""
    from app.engine.models.audio.qwen3_asr import CONV_CHUNKS, WINDOW_BATCH, audio_tokens

    window = audio_tokens(cfg.chunk_frames, cfg) * (cfg.n_window_infer // cfg.chunk_frames)
    positions = -(-cfg.num_mel_bins // 4) * -(-cfg.chunk_frames // 4)  # the second convolution's outputs
    convolutions = 2 * CONV_CHUNKS * cfg.conv_channels * 9 * positions
    layer = context * (6 * cfg.hidden_size + 2 * cfg.ffn_size)
    scores = min(WINDOW_BATCH, -(-context // window)) * cfg.num_heads * window**2
    return max(convolutions, layer + scores) * FLOAT_BYTES


def _gemma4_activation_bytes(hidden: int, mel_bins: int, channels: tuple[int, int]) -> int:
    """Gemma 4's tower on its longest clip (the module docstring's count)."""
    c0, c1 = channels
    frames = GEMMA4_MAX_SECONDS * GEMMA4_FRAMES_PER_SECOND
    t1, f1 = -(-frames // 2), -(-mel_bins // 2)
    t2, f2 = -(-t1 // 2), -(-f1 // 2)
    first = t1 * f1 * 9 + 5 * c0 * t1 * f1  # patches; output and the LayerNorm's four temporaries
    second = 2 * c0 * t1 * f1 + t2 * f2 * c0 * 9 + 4 * c1 * t2 * f2  # input and padded; patches; output
    conformer = t2 * 12 * hidden  # residual, normed copy, 4x feed-forward, GLU's 2x
    return max(first, second, conformer) * FLOAT_BYTES
