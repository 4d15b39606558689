"""Audio encoders: speech to the text model's input embeddings (soft tokens), beside `vision/`.

Qwen3-ASR (`qwen3_asr.py`: chunked convolutions, a windowed Whisper-style encoder and a two-layer
projector feeding Qwen3), its config and tensors (`qwen3_asr_config.py`, `qwen3_asr_weights.py`),
and the log-mel features its feature extractor computes, in numpy (`mel.py`). Gemma 4's audio tower
and embedder (`gemma4_audio.py`, a conformer), its config and tensors (`gemma4_audio_config.py`), its
log-mel front end (`gemma4_audio_features.py`) and prompt expansion (`gemma4_audio_prompter.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.engine.models.audio.gemma4_audio import Gemma4AudioTower
from app.engine.models.audio.gemma4_audio_config import (
    gemma4_audio_config,
    has_gemma4_audio,
    load_gemma4_audio,
)
from app.engine.models.audio.qwen3_asr import Qwen3AsrAudioEncoder
from app.engine.models.audio.qwen3_asr_config import is_qwen3_asr, qwen3_asr_audio_config
from app.engine.models.audio.qwen3_asr_weights import load_qwen3_asr_audio

__all__ = ["Gemma4AudioTower", "Qwen3AsrAudioEncoder", "load_audio_encoder", "load_gemma4_audio_tower"]


def load_audio_encoder(folder: Path, hf_config: dict[str, Any], backend: Any) -> Qwen3AsrAudioEncoder | None:
    """The folder's audio encoder (a Qwen3-ASR checkpoint's), or None for a model without one."""
    if not is_qwen3_asr(hf_config):
        return None
    cfg = qwen3_asr_audio_config(folder, hf_config)
    return Qwen3AsrAudioEncoder(backend, cfg, load_qwen3_asr_audio(folder, cfg))


def load_gemma4_audio_tower(folder: Path, hf_config: dict[str, Any], backend: Any) -> Gemma4AudioTower | None:
    """A Gemma 4 folder's audio tower and embedder, or None for one without `audio_config`."""
    if not has_gemma4_audio(hf_config):
        return None
    cfg = gemma4_audio_config(folder, hf_config)
    return Gemma4AudioTower(backend, cfg, load_gemma4_audio(folder, cfg))
