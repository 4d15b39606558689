"""The engine's audio glue: a model's audio tower loaded beside its text model (and its vision tower),
so a chat prompt may hold audio clips as it holds images: a Gemma 4 folder with an audio_config, or a
Qwen3-ASR folder (Qwen3 with its audio encoder and projector).

The runner has one soft-token embedder; where the model has both an image and an audio tower it routes
each input to its modality's (`SoftTokenTowers`). A GGUF (whose audio tower would be an mmproj) takes no
audio yet.
"""

from __future__ import annotations

import logging
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.audio import load_audio_encoder, load_gemma4_audio_tower
from app.engine.models.audio.gemma4_audio_prompter import Gemma4AudioPrompter
from app.engine.models.audio.qwen3_asr_prompter import Qwen3AsrPrompter
from app.engine.worker.images import ImageEmbedder, SoftTokenTowers

log = logging.getLogger(__name__)


class NoAudioError(ValueError):
    """An audio clip was sent to a model without an audio tower."""


def attach_audio(runner: Any, checkpoint: Any, tokenizer: Any) -> Gemma4AudioPrompter | Qwen3AsrPrompter | None:
    """Load the checkpoint's audio tower beside whatever soft-token tower the runner has; the prompter
    for the server, or None for a model without audio."""
    if checkpoint.format == "gguf":
        return None
    folder, hf_config = checkpoint.path, checkpoint.hf_config or {}
    try:
        if checkpoint.architecture == "gemma4":
            tower = load_gemma4_audio_tower(folder, hf_config, runner.backend)
            width = None if tower is None else tower.config.text_hidden_size
        else:
            tower = load_audio_encoder(folder, hf_config, runner.backend)
            width = None if tower is None else tower.config.output_dim
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
