"""OpenAI audio transcriptions (`POST /v1/audio/transcriptions`): the multipart form and the JSON replies.

The form is read as one model (FastAPI's form models), so the route stays a single parameter.
The JSON reply shapes mirror what `transcript_formats` renders, so `/openapi.json` documents them.
"""

from __future__ import annotations

from typing import Literal

from fastapi import UploadFile
from pydantic import BaseModel, ConfigDict, Field


class TranscriptionForm(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    file: UploadFile = Field(description="the audio: any format FFmpeg reads (wav, mp3, m4a, ogg, webm, ...)")
    model: str = Field(description="'whisper-1' or the loaded Whisper model's name")
    language: str | None = Field(default=None, description="ISO-639-1 code or English name; omit to detect")
    prompt: str | None = Field(default=None, description="text that guides spelling and style")
    # a str, not a Literal, so an unknown format gets the message naming the known ones
    response_format: str = Field(default="json", description="json, text, srt, verbose_json or vtt")
    temperature: float = Field(default=0.0, ge=0.0, le=1.0)
    # the openai SDK sends arrays in multipart as `name[]`; curl users often write the bare name
    timestamp_granularities_list: list[str] = Field(
        default_factory=list, alias="timestamp_granularities[]", description="segment and/or word"
    )
    timestamp_granularities: list[str] = Field(default_factory=list, description="same as the [] form")
    stream: bool = Field(default=False, description="not supported by Whisper models (as for whisper-1)")

    @property
    def granularities(self) -> list[str]:
        return list(dict.fromkeys([*self.timestamp_granularities_list, *self.timestamp_granularities]))


class TranscriptionUsage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: int


class TranscriptionJson(BaseModel):
    """response_format "json"."""

    text: str
    usage: TranscriptionUsage


class TranscriptionWord(BaseModel):
    word: str
    start: float
    end: float


class TranscriptionSegment(BaseModel):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


class TranscriptionVerbose(BaseModel):
    """response_format "verbose_json": segments and/or words as `timestamp_granularities` asked."""

    task: Literal["transcribe"] = "transcribe"
    language: str
    duration: float
    text: str
    words: list[TranscriptionWord] | None = None
    segments: list[TranscriptionSegment] | None = None
    usage: TranscriptionUsage
