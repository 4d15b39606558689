"""The engine's audio glue: a model's audio tower loaded beside its text model (and its vision tower),
so a chat prompt may hold audio clips as it holds images: a Gemma 4 folder with an audio_config, or a
Qwen3-ASR folder (Qwen3 with its audio encoder and projector). Granite Speech's encoder is not attached
here: transformers turns its LoRA adapter on whenever audio is present, and tasks/speech_llm.py loads
the model with the adapter merged and attaches the encoder itself.

A Gemma 4 GGUF's audio tower comes from llama.cpp's mmproj (models/audio/gemma4_audio_mmproj.py). The
runner has one soft-token embedder; where the model has both an image and an audio tower it routes each
input to its modality's (`SoftTokenTowers`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.audio import load_audio_encoder, load_gemma4_audio_tower
from app.engine.models.audio.gemma4_audio import Gemma4AudioTower
from app.engine.models.audio.gemma4_audio_mmproj import load_gemma4_audio_mmproj
from app.engine.models.audio.gemma4_audio_prompter import AUDIO, BOA, EOA, Gemma4AudioPrompter
from app.engine.models.audio.qwen3_asr_config import is_qwen3_asr
from app.engine.models.audio.qwen3_asr_prompter import Qwen3AsrPrompter
from app.engine.models.vision.weights import find_mmproj
from app.engine.worker.images import ImageEmbedder, SoftTokenTowers

log = logging.getLogger(__name__)


class NoAudioError(ValueError):
    """An audio clip was sent to a model without an audio tower."""


def attach_audio(
    runner: Any, checkpoint: Any, tokenizer: Any, mmproj: str | None = None
) -> Gemma4AudioPrompter | Qwen3AsrPrompter | None:
    """Load the checkpoint's audio tower (its own, or a Gemma 4 GGUF's audio mmproj: `mmproj`, or the one
    beside it) beside whatever soft-token tower the runner has; the prompter for the server, or None for
    a model without audio."""
    folder, hf_config = checkpoint.path, checkpoint.hf_config or {}
    try:
        if checkpoint.format == "gguf":
            tower = _gemma4_mmproj_tower(runner.backend, checkpoint, tokenizer, mmproj)
            width = None if tower is None else tower.config.text_hidden_size
        elif checkpoint.architecture == "gemma4":
            tower = load_gemma4_audio_tower(folder, hf_config, runner.backend)
            width = None if tower is None else tower.config.text_hidden_size
        elif is_qwen3_asr(hf_config):
            tower = load_audio_encoder(folder, hf_config, runner.backend)
            width = tower.config.output_dim
        else:  # Granite Speech's audio needs its LoRA adapter merged: tasks/speech_llm.py attaches it
            tower = None
    except ValueError as exc:  # CheckpointError too: the message names the file and the key
        raise CheckpointError(str(exc)) from None
    if tower is None:
        return None
    text_hidden = checkpoint.tensors["token_embd.weight"].shape[1]
    if width != text_hidden:
        raise CheckpointError(
            f"{folder}: the audio projector outputs width {width}, the text model's is {text_hidden}"
        )
    gemma = checkpoint.architecture == "gemma4"
    prompter = (Gemma4AudioPrompter if gemma else Qwen3AsrPrompter)(tower.config, tokenizer)
    vision = runner.images.vision if runner.images is not None else None
    embedded = tower if vision is None else SoftTokenTowers(image=vision, audio=tower)
    runner.images = ImageEmbedder(embedded, runner.backend)
    log.info("audio tower: %d layers", tower.config.num_layers)
    return prompter


def _gemma4_mmproj_tower(backend: Any, checkpoint: Any, tokenizer: Any, mmproj: str | None) -> Any:
    """A Gemma 4 GGUF's audio tower from its mmproj (llama.cpp's audio half), or None without one."""
    if checkpoint.architecture != "gemma4":
        return None
    path = Path(mmproj) if mmproj is not None else find_mmproj(Path(checkpoint.path))
    if path is None:
        return None
    ids = {name: tokenizer.token_to_id(name) for name in (AUDIO, BOA, EOA)}
    loaded = load_gemma4_audio_mmproj(path, ids)
    return None if loaded is None else Gemma4AudioTower(backend, *loaded)
