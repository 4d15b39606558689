"""Granite Speech's prompts and replies: the clip's stacked log-mel as the soft-token input, and the prompt
the model card builds with Granite's chat template: its system turn (knowledge cutoff, today's date, "You
are Granite..."), the user turn `<|audio|>` (one per audio embedding) then the card's transcription
instruction, and the assistant turn opened. The reply is the transcript itself; the model names no
language, so a transcript's language is the one the request gave, if any.

A request's `prompt` (OpenAI's context for the transcription: names, spellings, the previous segment)
goes at the end of the system turn."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import numpy as np

from app.engine.images import ImageInput
from app.engine.models.audio.granite_speech_config import GraniteSpeechAudioConfig
from app.engine.models.audio.granite_speech_features import audio_token_count, input_features

AUDIO_TOKEN = "<|audio|>"
INSTRUCTION = "can you transcribe the speech into a written format?"
_SYSTEM = "Knowledge Cutoff Date: April 2024.\nToday's Date: {today}.\nYou are Granite, developed by IBM. You are a helpful AI assistant"


def _turn(role: str, text: str) -> str:
    return f"<|start_of_role|>{role}<|end_of_role|>{text}<|end_of_text|>\n"


class GraniteSpeechPrompter:
    """What `place_images` asks of a prompter (`image_token_id`, `tokens_for`), for audio."""

    def __init__(
        self,
        cfg: GraniteSpeechAudioConfig,
        tokenizer: Any,
        today: Callable[[], datetime.date] = datetime.date.today,
    ) -> None:
        self.cfg, self.tokenizer, self.today = cfg, tokenizer, today
        self.image_token_id = cfg.audio_token_id
        found = tokenizer.token_to_id(AUDIO_TOKEN)
        if found is not None and found != cfg.audio_token_id:
            raise ValueError(
                f"tokenizer.json gives {AUDIO_TOKEN} id {found}, config.json audio_token_index {cfg.audio_token_id}"
            )

    def audio_input(self, samples: np.ndarray) -> ImageInput:
        """Mono samples at the model's rate -> the clip's stacked log-mel frames as a soft-token input."""
        return ImageInput(input_features(samples, self.cfg.mel))

    def tokens_for(self, audio: ImageInput) -> int:
        return audio_token_count(audio.pixel_values.shape[0], self.cfg)

    def prompt_ids(self, audio: ImageInput, language: str | None = None, context: str = "") -> list[int]:
        """`language` does not change the prompt: the model transcribes what it hears (the card's one
        instruction for every language it takes)."""
        day = self.today()
        system = _SYSTEM.format(
            today=f"{day:%B} {day.day}, {day.year}"
        )  # as the card writes it: "April 9, 2025"
        if context:
            system += f"\n{context}"
        text = (
            _turn("system", system)
            + _turn("user", AUDIO_TOKEN * self.tokens_for(audio) + INSTRUCTION)
            + "<|start_of_role|>assistant<|end_of_role|>"
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def parse(self, token_ids: list[int], forced_language: str | None = None) -> tuple[str | None, str]:
        """`(the language the request gave, transcript)`: the whole reply is the transcript."""
        return forced_language, self.tokenizer.decode(list(token_ids), skip_special_tokens=True).strip()
