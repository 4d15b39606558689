"""What the speech models' llama.cpp mmproj readers share (Qwen3-ASR's `qwen3a`, Granite Speech's
`granite_speech`): the audio projector type looked up as clip.cpp looks it up, the file opened and refused
unless it is the family's, and the `clip.audio.*` sizes read as positive integers; errors name the file and
the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.engine.loader.gguf import GGUFFile, read_gguf
from app.engine.loader.names import CheckpointError
from app.engine.models.config import positive_integer

AUDIO_TYPE_KEY = (
    "clip.audio.projector_type"  # written where a file mixes modalities (Qwen3-ASR's converter too)
)
TYPE_KEY = "clip.projector_type"  # an audio-only file's (Granite Speech's converter writes only this one)


def projector_type_key(meta: dict[str, Any]) -> str:
    """The key the audio projector's type is read from: the audio one where the file has it, else the general one."""
    return AUDIO_TYPE_KEY if AUDIO_TYPE_KEY in meta else TYPE_KEY


def audio_projector_type(meta: dict[str, Any]) -> Any:
    return meta.get(projector_type_key(meta))


def open_speech_mmproj(path: Path, projector: str, family: str) -> GGUFFile:
    """The mmproj at `path`, read; CheckpointError naming the file and the type it has unless it is `projector`."""
    file = read_gguf(path)
    found = audio_projector_type(file.metadata)
    if found != projector:
        raise CheckpointError(
            f"{path}: {projector_type_key(file.metadata)} is {found!r}, not {projector!r} ({family})"
        )
    return file


def audio_size(path: Path, meta: dict[str, Any], name: str) -> int:
    """`clip.audio.{name}` as a positive integer; CheckpointError naming the file and the key otherwise."""
    return positive_integer(meta.get(f"clip.audio.{name}"), f"{path}: clip.audio.{name}")


def audio_layer_norm_eps(meta: dict[str, Any], default: float) -> float:
    """The encoder's norm epsilon; `default`, the converter's, where the file leaves it out."""
    return float(meta.get("clip.audio.attention.layer_norm_epsilon", default))
