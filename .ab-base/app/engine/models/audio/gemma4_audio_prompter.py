"""Gemma 4's audio in prompts: a clip's samples to the soft-token input (its log-mel), and where the
chat template's audio placeholder stands, what Gemma4Processor puts there: `<|audio>`, one `<|audio|>`
per soft token (a clip's valid frames halved twice), `<audio|>`.

Gemma 4's own template writes `<|audio|>` for an audio part; the server marks the part's place with a
private-use character instead (as it does images) and `expand` replaces each mark, in order.
"""

from __future__ import annotations

import numpy as np

from app.engine.images import ImageInput
from app.engine.loader.names import CheckpointError
from app.engine.models.audio.gemma4_audio_config import Gemma4AudioConfig
from app.engine.models.audio.gemma4_audio_features import gemma4_log_mel, soft_tokens
from app.engine.models.audio.placeholders import expand_placeholders

BOA, EOA, AUDIO = "<|audio>", "<audio|>", "<|audio|>"


class AudioClipError(ValueError):
    """A clip the model cannot take (empty, or longer than its longest); the message says which."""


class Gemma4AudioPrompter:
    """What `place_images` asks of a prompter (`image_token_id`, `tokens_for`), for audio; and the
    clip's preparation and its placeholder's expansion."""

    def __init__(self, cfg: Gemma4AudioConfig, tokenizer) -> None:
        self.cfg = cfg
        ids = {name: tokenizer.token_to_id(name) for name in (BOA, EOA, AUDIO)}
        missing = [name for name, i in ids.items() if i is None]
        if missing:
            raise CheckpointError(f"the tokenizer lacks the audio tokens {missing}: it cannot take audio")
        if ids[AUDIO] != cfg.audio_token_id:
            raise CheckpointError(
                f"the tokenizer's {AUDIO} is id {ids[AUDIO]}, config.json's audio_token_id {cfg.audio_token_id}"
            )
        self.image_token_id: int = cfg.audio_token_id

    @property
    def sampling_rate(self) -> int:
        return self.cfg.mel.sampling_rate

    @property
    def max_seconds(self) -> float:
        """The longest clip the model takes (the feature extractor's 30 s)."""
        return self.cfg.max_samples / self.sampling_rate

    def audio_input(self, samples: np.ndarray) -> ImageInput:
        """Mono samples at 16 kHz -> the clip's log-mel frames as a soft-token input (AudioClipError
        for a clip too short to make one frame, or longer than the model takes)."""
        if samples.size > self.cfg.max_samples:
            raise AudioClipError(
                f"the clip is {samples.size / self.sampling_rate:.1f} s long; the model takes at most "
                f"{self.max_seconds:.0f} s of audio at once"
            )
        mel = gemma4_log_mel(samples, self.cfg.mel)
        if mel.shape[0] == 0:
            raise AudioClipError(
                f"the clip is {samples.size / self.sampling_rate * 1000:.0f} ms long, too short to hear"
            )
        return ImageInput(mel, modality="audio")

    def tokens_for(self, audio: ImageInput) -> int:
        return soft_tokens(audio.pixel_values.shape[0])

    def expansion(self, audio: ImageInput) -> str:
        return f"{BOA}{AUDIO * self.tokens_for(audio)}{EOA}"

    def expand(self, text: str, clips: list[ImageInput], marker: str) -> str:
        """The rendered prompt with each `marker` replaced by its clip's tokens, in order; ValueError
        when marks and clips do not pair up."""
        return expand_placeholders(text, clips, marker, self.expansion)
