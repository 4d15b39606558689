"""Qwen3-ASR's prompts and replies: the clip's log-mel as the soft-token input, the prompt its chat
template renders (ChatML: a system turn with the optional context, the audio as the user turn, the
assistant turn opened and, for a forced language, prefilled with `language NAME<asr_text>`), and the
reply split back into the language the model names and the transcript after `<asr_text>`."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.images import ImageInput
from app.engine.models.audio.mel import log_mel
from app.engine.models.audio.placeholders import expand_placeholders
from app.engine.models.audio.qwen3_asr import audio_tokens
from app.engine.models.audio.qwen3_asr_config import Qwen3AsrAudioConfig

ASR_TEXT = "<asr_text>"
# The names the model was trained with after "language " (transformers' LANGUAGE_CODE_TO_NAME).
LANGUAGE_NAMES = {
    "ar": "Arabic", "yue": "Cantonese", "zh": "Chinese", "cs": "Czech", "da": "Danish", "nl": "Dutch",
    "en": "English", "fil": "Filipino", "fi": "Finnish", "fr": "French", "de": "German", "el": "Greek",
    "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean",
    "mk": "Macedonian", "ms": "Malay", "fa": "Persian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "es": "Spanish", "sv": "Swedish", "th": "Thai", "tr": "Turkish", "vi": "Vietnamese",
}  # fmt: skip
_CODES = {name.lower(): code for code, name in LANGUAGE_NAMES.items()}


class Qwen3AsrPrompter:
    """What `place_images` asks of a prompter (`image_token_id`, `tokens_for`), for audio; and, for a chat
    prompt, the audio part's expansion (`<|audio_start|>`, the clip's `<|audio_pad|>`s, `<|audio_end|>`)."""

    max_seconds = None  # no limit of its own: the context bounds a clip (13 tokens a second)

    def __init__(self, cfg: Qwen3AsrAudioConfig, tokenizer: Any) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer
        self.image_token_id = cfg.audio_token_id
        self.asr_text_id = tokenizer.token_to_id(ASR_TEXT)

    def audio_input(self, samples: np.ndarray) -> ImageInput:
        """Mono samples at the model's rate -> the clip's log-mel frames as a soft-token input."""
        return ImageInput(log_mel(samples, self.cfg.mel), modality="audio")

    def tokens_for(self, audio: ImageInput) -> int:
        return audio_tokens(audio.pixel_values.shape[1], self.cfg)

    def expand(self, text: str, clips: list[ImageInput], marker: str) -> str:
        """Each `marker` in a rendered chat prompt replaced by its clip's tokens, in order."""
        return expand_placeholders(
            text, clips, marker, lambda c: f"<|audio_start|>{'<|audio_pad|>' * self.tokens_for(c)}<|audio_end|>"
        )

    def prompt_ids(self, audio: ImageInput, language: str | None = None, context: str = "") -> list[int]:
        """`language`: an ISO code or a name (the model's own name for it is prefilled)."""
        pads = "<|audio_pad|>" * self.tokens_for(audio)
        text = (
            f"<|im_start|>system\n{context}<|im_end|>\n<|im_start|>user\n<|audio_start|>{pads}<|audio_end|>"
            "<|im_end|>\n<|im_start|>assistant\n"
        )
        if language:
            text += f"language {LANGUAGE_NAMES.get(language.lower(), language)}{ASR_TEXT}"
        return self.tokenizer.encode(text, add_special_tokens=False)

    def parse(self, token_ids: list[int], forced_language: str | None = None) -> tuple[str | None, str]:
        """`(language code or name, transcript)` of a reply: `language NAME<asr_text>TEXT`, or
        TEXT alone where the language was prefilled (`forced_language`) or the model left it out."""
        ids = list(token_ids)
        language = forced_language
        if self.asr_text_id is not None and self.asr_text_id in ids:
            cut = ids.index(self.asr_text_id)
            head = self.tokenizer.decode(ids[:cut], skip_special_tokens=True).strip()
            ids = ids[cut + 1 :]
            if head.lower().startswith("language "):
                named = head[len("language ") :].strip()
                language = None if named.lower() == "none" else _CODES.get(named.lower(), named)
        return language, self.tokenizer.decode(ids, skip_special_tokens=True).strip()
