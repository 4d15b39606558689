"""Audio parts of API requests (OpenAI chat's `input_audio`): collected while messages are converted,
like image parts (images.py), then decoded and checked before the prompt is built.

`{"type": "input_audio", "input_audio": {"data": <base64>, "format": "wav" | "mp3" | ...}}` becomes
AUDIO_MARK in the message's text; `load_audio` turns each part into the model's soft-token input (400s
naming the part: the model takes no audio, not base64, over the upload limit, not audio FFmpeg decodes,
longer than the model takes); PromptBuilder.chat expands the marks into the model's audio tokens.
The format is a hint only: FFmpeg reads the container from the bytes. Anthropic's Messages API has no
audio block, so audio comes through OpenAI's chat completions (and the Responses API's messages) only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.server.errors import bad_request
from app.engine.server.images import AUDIO_MARK, decode_base64

__all__ = ["AUDIO_MARK", "AudioSource", "load_audio", "openai_audio"]

# What OpenAI documents for input_audio (wav, mp3) and what else FFmpeg reads from bytes alone
AUDIO_FORMATS = frozenset(
    ["wav", "mp3", "flac", "ogg", "oga", "opus", "webm", "m4a", "mp4", "aac", "pcm16", "aiff"]
)


@dataclass(frozen=True)
class AudioSource:
    param: str  # where in the request, for errors
    data: str  # base64


def openai_audio(part: Any, param: str) -> AudioSource:
    """An OpenAI `input_audio` part; 400 naming the part when its shape is wrong."""
    value = (part.model_extra or {}).get("input_audio")
    if not isinstance(value, dict) or not isinstance(value.get("data"), str) or not value["data"]:
        raise bad_request(
            "An input_audio part needs {'data': <base64 audio>, 'format': 'wav' | 'mp3' | ...}.", param=param
        )
    fmt = value.get("format")
    if fmt is not None and (not isinstance(fmt, str) or fmt.lower() not in AUDIO_FORMATS):
        raise bad_request(
            f"The audio format {fmt!r} is not one this server reads ({', '.join(sorted(AUDIO_FORMATS))}).",
            param=f"{param}.input_audio.format",
        )
    return AudioSource(f"{param}.input_audio", value["data"])


def load_audio(sources: list[AudioSource], prompter: Any, settings: Any) -> list[Any]:
    """The parts' soft-token inputs, in order; ApiError (400) naming the first bad one."""
    if not sources:
        return []
    if prompter is None:
        raise bad_request(
            "The loaded model has no audio input: it cannot take input_audio parts.",
            param=sources[0].param,
            code="model_has_no_audio",
        )
    from app.engine.models.audio.gemma4_audio_prompter import AudioClipError
    from app.engine.tasks.audio_decode import AudioError, decode_audio

    clips = []
    for source in sources:
        data = decode_base64(source.data, source.param, settings.max_audio_body_bytes, what="audio")
        try:
            limit = prompter.max_seconds or settings.max_audio_seconds  # the model's own, else the server's
            samples = decode_audio(data, source.param, max_seconds=limit)
            clips.append(prompter.audio_input(samples))
        except (AudioError, AudioClipError) as exc:
            problem = exc.problem if isinstance(exc, AudioError) else str(exc)
            raise bad_request(
                f"The audio part was refused: {problem.rstrip('.')}.", param=source.param
            ) from None
    return clips
