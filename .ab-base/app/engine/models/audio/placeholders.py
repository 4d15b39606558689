"""A rendered prompt's audio placeholders replaced, in order, by each clip's tokens (both families'
prompters: Gemma 4's `<|audio>...<audio|>`, Qwen3-ASR's `<|audio_start|>...<|audio_end|>`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def expand_placeholders(text: str, clips: list[Any], marker: str, expansion: Callable[[Any], str]) -> str:
    """ValueError when the text's markers and the clips do not pair up."""
    parts = text.split(marker)
    if len(parts) - 1 != len(clips):
        raise ValueError(f"the prompt has {len(parts) - 1} audio placeholders for {len(clips)} clips")
    return parts[0] + "".join(expansion(clip) + after for clip, after in zip(clips, parts[1:], strict=True))
