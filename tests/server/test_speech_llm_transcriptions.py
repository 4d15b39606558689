"""/v1/audio/transcriptions served by a speech LLM (the tiny random-weight Qwen3-ASR of
tests/fixtures/qwen3_asr) beside Whisper: `model` picks it by its folder name, every response format
comes back, and bad files are refused naming them. Whisper stays loaded lazily and is never run here.

Random weights transcribe nothing real: the expected text is the decoded greedy tokens transformers
gave for the clip with English forced (tests/engine/audio/test_qwen3_asr.py checks those tokens);
the timestamps are one segment over the clip, the model giving none.
"""

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
MANIFEST = json.loads((FIXTURES / "qwen3_asr" / "manifest.json").read_text())
GREEDY = MANIFEST["cases"]["speech/English"]["greedy"]
DURATION = MANIFEST["samples"]["speech"] / 16_000
NAME = "qwen3-asr-tiny"


@pytest.fixture(scope="module")
def asr(tmp_path_factory: pytest.TempPathFactory) -> SpeechLLMTranscriber:
    return load_named(FIXTURES / "qwen3_asr" / "hf", tmp_path_factory.mktemp("models") / NAME, len(GREEDY))


@pytest.fixture(scope="module")
def base_url(asr: SpeechLLMTranscriber) -> Iterator[str]:
    with speech_llm_server([asr]) as url:
        yield url


def post(
    base_url: str, data: dict[str, str], payload: bytes | None = None, name: str = "speech.wav"
) -> httpx.Response:
    body = SPEECH.read_bytes() if payload is None else payload
    return httpx.post(
        f"{base_url}/v1/audio/transcriptions",
        data={"model": NAME, "language": "en", **data},
        files={"file": (name, body, "audio/wav")},
        timeout=CLIENT_TIMEOUT,
    )


def expected_text(asr: SpeechLLMTranscriber) -> str:
    return asr.task.engine.tokenizer.decode(GREEDY, skip_special_tokens=True).strip()


def test_models_lists_whisper_and_the_speech_model(base_url: str) -> None:
    ids = [card["id"] for card in httpx.get(f"{base_url}/v1/models", timeout=CLIENT_TIMEOUT).json()["data"]]
    assert NAME in ids and "whisper-1" in ids


def test_json_and_text_hold_the_greedy_transcript(base_url: str, asr: SpeechLLMTranscriber) -> None:
    body = post(base_url, {}).json()
    assert body["text"] == expected_text(asr)
    assert body["usage"] == {"type": "duration", "seconds": 6}
    text = post(base_url, {"response_format": "text"})
    assert text.status_code == 200 and text.text == expected_text(asr) + "\n"


def test_verbose_json_has_the_language_and_one_segment_over_the_clip(
    base_url: str, asr: SpeechLLMTranscriber
):
    body = post(base_url, {"response_format": "verbose_json"}).json()
    assert body["language"] == "english"
    assert body["duration"] == pytest.approx(DURATION, abs=1e-3)
    [segment] = body["segments"]
    assert (segment["start"], segment["text"], segment["tokens"]) == (0.0, expected_text(asr), GREEDY)
    assert segment["end"] == pytest.approx(DURATION, abs=1e-3)


@pytest.mark.parametrize(
    ("fmt", "cue"),
    [("srt", "1\n00:00:00,000 --> 00:00:05,131\n"), ("vtt", "WEBVTT\n\n00:00:00.000 --> 00:00:05.131\n")],
)
def test_srt_and_vtt_have_one_cue_over_the_clip(fmt: str, cue: str, base_url: str, asr: SpeechLLMTranscriber):
    response = post(base_url, {"response_format": fmt})
    assert response.status_code == 200
    assert response.text == f"{cue}{expected_text(asr)}\n\n"


@pytest.mark.parametrize(
    ("payload", "problem"),
    [(b"RIFF\x24\x00\x00\x00WAVEfmt ", "cannot decode"), (b"%PDF-1.7\n" * 40, "cannot decode")],
)
def test_a_bad_file_is_refused_naming_it(payload: bytes, problem: str, base_url: str) -> None:
    response = post(base_url, {}, payload, name="minutes.wav")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (
        error["param"] == "file"
        and error["message"].startswith("minutes.wav: ")
        and problem in error["message"]
    )


def test_an_unknown_model_is_refused_listing_the_loaded_ones(base_url: str) -> None:
    response = post(base_url, {"model": "qwen3-asr-huge"})
    assert response.status_code == 404
    assert NAME in response.json()["error"]["message"]
