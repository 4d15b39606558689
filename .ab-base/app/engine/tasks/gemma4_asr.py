"""Gemma 4 (with an audio tower) as a transcriber's prompter: the prompt its model card gives for speech
recognition, rendered by the model's own chat template, and the reply as the transcript.

The card's ASR prompt is a user turn holding the audio, then the instruction (the language named when
one is given, "its original language" otherwise). The template writes the audio part as `<|audio|>`,
which Gemma4Processor replaces by `<|audio>`, one `<|audio|>` per soft token and `<audio|>`; so the
user turn's text here starts with `<|audio|>` and the prompter expands it the same way. A client's
`prompt` (context, spellings) goes in a system turn before it. Gemma names no language and gives no
timestamps: the transcript is the reply's text, one segment per window of at most 30 s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.images import ImageInput
from app.engine.models.audio.gemma4_audio_prompter import AUDIO, Gemma4AudioPrompter
from app.engine.tasks.transcript_formats import language_name

INSTRUCTIONS = (
    "\n\nFollow these specific instructions for formatting the answer:\n"
    "* Only output the transcription, with no newlines.\n"
    "* When transcribing numbers, write the digits, i.e. write 1.7 and not one point seven, "
    "and write 3 instead of three."
)


def asr_instruction(language: str | None) -> str:
    """The model card's transcription request; `language` an ISO code (or None: the clip's own)."""
    if language is None:
        return "Transcribe the following speech segment in its original language." + INSTRUCTIONS
    name = language_name(language).capitalize()
    return f"Transcribe the following speech segment in {name} into {name} text." + INSTRUCTIONS


class Gemma4AsrPrompter:
    """The prompter SpeechLLMTranscriber drives (as Qwen3AsrPrompter): clip in, prompt ids, reply out."""

    def __init__(self, audio: Gemma4AudioPrompter, chat_template: Any, tokenizer: Any) -> None:
        self.audio, self.template, self.tokenizer = audio, chat_template, tokenizer
        self.image_token_id = audio.image_token_id
        self.window_samples: int | None = audio.cfg.max_samples  # longer clips go window by window

    def audio_input(self, samples: np.ndarray) -> ImageInput:
        return self.audio.audio_input(samples)

    def tokens_for(self, clip: ImageInput) -> int:
        return self.audio.tokens_for(clip)

    def prompt_ids(self, clip: ImageInput, language: str | None = None, context: str = "") -> list[int]:
        messages = [{"role": "system", "content": context}] if context else []
        messages.append({"role": "user", "content": AUDIO + asr_instruction(language)})
        text = self.audio.expand(self.template.render(messages, add_generation_prompt=True), [clip], AUDIO)
        tokenizer = self.tokenizer
        bos = tokenizer.id_to_token(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else None
        return tokenizer.encode(
            text, add_special_tokens=not (bos and text.startswith(bos)), parse_special=True
        )

    def parse(self, token_ids: list[int], forced_language: str | None = None) -> tuple[str | None, str]:
        """`(the forced language, or None, transcript)`: the model names no language."""
        return forced_language, self.tokenizer.decode(list(token_ids), skip_special_tokens=True).strip()
