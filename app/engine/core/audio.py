"""The engine's audio glue: a Gemma 4 folder's audio tower loaded beside its text model (and its
vision tower), so a chat prompt may hold audio clips as it holds images.

The runner has one soft-token embedder; where the model has both towers it routes each input to its
modality's (`SoftTokenTowers`). A GGUF (whose audio tower would be an mmproj) takes no audio yet.
"""

from __future__ import annotations

import logging
from typing import Any

from app.engine.loader.names import CheckpointError
from app.engine.models.audio import load_gemma4_audio_tower
from app.engine.models.audio.gemma4_audio_prompter import Gemma4AudioPrompter
from app.engine.worker.images import ImageEmbedder, SoftTokenTowers

log = logging.getLogger(__name__)


class NoAudioError(ValueError):
    """An audio clip was sent to a model without an audio tower."""


def attach_audio(runner: Any, checkpoint: Any, tokenizer: Any) -> Gemma4AudioPrompter | None:
    """Load the checkpoint's audio tower beside whatever soft-token tower the runner has; the prompter
    for the server, or None for a model without audio."""
    if checkpoint.architecture != "gemma4" or checkpoint.format == "gguf":
        return None
    try:
        tower = load_gemma4_audio_tower(checkpoint.path, checkpoint.hf_config or {}, runner.backend)
    except ValueError as exc:  # CheckpointError too: the message names the file and the key
        raise CheckpointError(str(exc)) from None
    if tower is None:
        return None
    text_hidden = checkpoint.tensors["token_embd.weight"].shape[1]
    if tower.config.text_hidden_size != text_hidden:
        raise CheckpointError(
            f"{checkpoint.path}: the audio embedder outputs width {tower.config.text_hidden_size}, "
            f"the text model's is {text_hidden}"
        )
    prompter = Gemma4AudioPrompter(tower.config, tokenizer)
    vision = runner.images.vision if runner.images is not None else None
    towers = SoftTokenTowers(image=vision, audio=tower)
    runner.images = ImageEmbedder(towers, runner.backend)
    cfg = tower.config
    log.info("audio tower: %d layers, up to %.0f s per clip", cfg.num_layers, prompter.max_seconds)
    return prompter
