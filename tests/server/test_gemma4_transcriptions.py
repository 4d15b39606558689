"""/v1/audio/transcriptions served by Gemma 4 with an audio tower (the tiny random-weight fixture of
tests/fixtures/gemma4_audio, `paddock serve --asr-model`) beside Whisper: `model` picks it by its folder
name and every response format comes back. Random weights transcribe nothing real: the text is the
decoded greedy tokens transformers gave for the model card's English transcription prompt
(tests/engine/audio/test_gemma4_asr.py checks them); one segment over the clip, the model giving no
timestamps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.engine.tasks.speech_llm import SpeechLLMTranscriber

from .helpers import CLIENT_TIMEOUT
from .speech_llm_server import load_named, speech_llm_server

FIXTURES = Path(__file__).parents[1] / "fixtures"
SPEECH = FIXTURES / "audio" / "speech.wav"
GREEDY = json.loads((FIXTURES / "gemma4_audio" / "manifest.json").read_text())["asr"]["greedy"]
NAME = "gemma4-audio-tiny"


@pytest.fixture(scope="module")
def asr(tmp_path_factory: pytest.TempPathFactory) -> SpeechLLMTranscriber:
    return load_named(FIXTURES / "gemma4_audio" / "hf", tmp_path_factory.mktemp("models") / NAME, len(GREEDY))


@pytest.fixture(scope="module")
def base_url(asr: SpeechLLMTranscriber) -> Iterator[str]:
    with speech_llm_server([asr]) as url:
        yield url


def post(base_url: str, data: dict[str, str]) -> httpx.Response:
    return httpx.post(
        f"{base_url}/v1/audio/transcriptions",
        data={"model": NAME, "language": "en", **data},
        files={"file": ("speech.wav", SPEECH.read_bytes(), "audio/wav")},
        timeout=CLIENT_TIMEOUT,
    )


@pytest.fixture(scope="module")
def text(asr: SpeechLLMTranscriber) -> str:
    decoded = asr.task.engine.tokenizer.decode(GREEDY, skip_special_tokens=True).strip()
    assert decoded  # the reference's tokens spell something
    return decoded


def test_models_lists_whisper_and_gemma4(base_url: str) -> None:
    ids = [card["id"] for card in httpx.get(f"{base_url}/v1/models", timeout=CLIENT_TIMEOUT).json()["data"]]
    assert NAME in ids and "whisper-1" in ids


def test_json_and_text(base_url: str, text: str) -> None:
    assert post(base_url, {}).json()["text"] == text
    plain = post(base_url, {"response_format": "text"})
    assert plain.status_code == 200 and plain.text == text + "\n"


def test_verbose_json_has_one_segment_over_the_clip(base_url: str, text: str) -> None:
    body = post(base_url, {"response_format": "verbose_json"}).json()
    assert body["language"] == "english" and body["duration"] == pytest.approx(5.131, abs=1e-3)
    [segment] = body["segments"]
    assert (segment["start"], segment["end"], segment["text"], segment["tokens"]) == (
        0.0,
        5.131,
        text,
        GREEDY,
    )


@pytest.mark.parametrize(
    ("fmt", "cue"),
    [("srt", "1\n00:00:00,000 --> 00:00:05,131\n"), ("vtt", "WEBVTT\n\n00:00:00.000 --> 00:00:05.131\n")],
)
def test_srt_and_vtt_have_one_cue(fmt: str, cue: str, base_url: str, text: str) -> None:
    response = post(base_url, {"response_format": fmt})
    assert response.status_code == 200 and response.text == f"{cue}{text}\n\n"


def test_without_a_language_the_model_names_none(base_url: str) -> None:
    body = post(base_url, {"language": "", "response_format": "verbose_json"}).json()
    assert body["language"] == ""  # Gemma 4 transcribes "in its original language" without naming it
    [segment] = body["segments"]
    assert (segment["start"], segment["end"]) == (0.0, 5.131) and len(segment["tokens"]) == len(GREEDY)
