"""The audio tower's share of will-it-fit: its weights as stored, and its working set to encode the
longest clip it takes.

Counted where the engine loads one beside the chat model: a Gemma 4 Hugging Face folder whose
config.json has an audio_config (models/audio/gemma4_audio*.py), its `audio_tower.*` / `embed_audio.*`
tensors by their names in the safetensors headers; or a Gemma 4 GGUF's mmproj with an audio half
(projector "gemma4a"), its `a.*` / `mm.a.*` tensors.

The working set peaks in the subsampling convolutions, each a product over gathered 3x3 patches
(models/audio/qwen3_asr.Conv3x3): the first convolution's output (channels[0] x frames/2 x bins/2) and
its LayerNorm's temporaries, or that output and its padded copy beside the second's patches
(frames/4 x bins/4 x channels[0] x 9) and output; measured with tracemalloc in the tests.
The conformer after it holds a few `[tokens, 4 x hidden]` rows and block-local attention logits, far
less. Sized at the feature extractor's 30 s (3,000 frames).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLOAT_BYTES = 4
MAX_SECONDS = 30  # Gemma4AudioFeatureExtractor's max_length: 480,000 samples at 16 kHz
FRAMES_PER_SECOND = 100  # 10 ms hops


@dataclass(frozen=True)
class AudioShape:
    weight_bytes: int
    hidden_size: int
    mel_bins: int
    conv_channels: tuple[int, int]
    source: str  # where the tower's weights are: the folder's safetensors
    max_frames: int = MAX_SECONDS * FRAMES_PER_SECOND

    def activation_bytes(self) -> int:
        c0, c1 = self.conv_channels
        t1, f1 = -(-self.max_frames // 2), -(-self.mel_bins // 2)
        t2, f2 = -(-t1 // 2), -(-f1 // 2)
        first = t1 * f1 * 9 + 5 * c0 * t1 * f1  # patches; output and the LayerNorm's four temporaries
        second = 2 * c0 * t1 * f1 + t2 * f2 * c0 * 9 + 4 * c1 * t2 * f2  # input and padded; patches; output
        conformer = t2 * 12 * self.hidden_size  # residual, normed copy, 4x feed-forward, GLU's 2x
        return max(first, second, conformer) * FLOAT_BYTES


def audio_from_hf_config(config: Mapping[str, Any], weight_bytes: int, source: str) -> AudioShape | None:
    """From a Gemma 4 config.json's audio_config (transformers' defaults for what it leaves out); None
    for a model whose audio the engine does not load."""
    audio = config.get("audio_config")
    if config.get("model_type") != "gemma4" or not isinstance(audio, Mapping):
        return None
    channels = audio.get("subsampling_conv_channels") or (128, 32)
    return AudioShape(
        weight_bytes=int(weight_bytes),
        hidden_size=int(audio.get("hidden_size", 1024)),
        mel_bins=int(channels[0]),  # the tower's projection takes channels[0] // 4 bins: as many mel bins
        conv_channels=(int(channels[0]), int(channels[1])),
        source=source,
    )


def is_audio_tensor(hf_name: str) -> bool:
    """A Hugging Face tensor of the audio side (tower or embedder), by its name."""
    return hf_name.removeprefix("model.").startswith(("audio_tower.", "embed_audio."))


def is_audio_gguf_tensor(name: str) -> bool:
    """An mmproj GGUF's tensor of the audio half (llama.cpp's `a.*` tower, `mm.a.*` projector)."""
    return name.startswith(("a.", "mm.a."))


def audio_of_mmproj_file(path: Path) -> AudioShape | None:
    """An mmproj's Gemma 4 audio tower, from its header and tensor table (no weights read); None for an
    mmproj without one."""
    from app.engine.loader.gguf import read_gguf
    from app.engine.models.audio.gemma4_audio_mmproj import is_gemma4_audio_mmproj

    file = read_gguf(path)
    if not is_gemma4_audio_mmproj(file.metadata):
        return None
    convs = [file.tensors.get(f"a.conv1d.{i}.weight") for i in (0, 1)]
    if convs[0] is None or convs[1] is None or "clip.audio.embedding_length" not in file.metadata:
        raise ValueError(f"{path.name} lacks its audio tower's convolutions or size: cannot size it")
    c0, c1 = convs[0].shape[0], convs[1].shape[0]
    return AudioShape(
        weight_bytes=sum(t.nbytes for name, t in file.tensors.items() if is_audio_gguf_tensor(name)),
        hidden_size=int(file.metadata["clip.audio.embedding_length"]),
        mel_bins=c0,
        conv_channels=(c0, c1),
        source=path.name,
    )


def audio_beside_gguf(model_path: str | Path, architecture: str) -> AudioShape | None:
    """The audio tower the engine would load beside this text GGUF (Gemma 4's mmproj), or None."""
    if architecture != "gemma4":
        return None
    from app.engine.models.vision.weights import find_mmproj

    found = find_mmproj(Path(model_path))
    return audio_of_mmproj_file(found) if found is not None else None
