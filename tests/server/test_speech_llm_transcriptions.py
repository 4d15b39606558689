"""/v1/audio/transcriptions served by speech LLMs (the tiny random-weight Qwen3-ASR of
tests/fixtures/qwen3_asr, also as llama.cpp's GGUF pair written from it by tests/qwen3_asr_pair.py, and
Granite Speech of tests/fixtures/granite_speech, loaded side by side) beside
Whisper: `model` picks one by its folder name, every response format comes back, and bad files are refused
naming them. Whisper stays loaded lazily and is never run here.

Random weights transcribe nothing real: the expected text is the decoded greedy tokens transformers gave
for the clip (Qwen3-ASR's with English forced, Granite's with the model card's date in its prompt;
tests/engine/audio/ checks those tokens); the timestamps are one segment over the clip, the models giving
none.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from qwen3_asr_pair import write_pair

from app.engine.tasks.speech_llm import SpeechLLMTranscriber

from .helpers import CLIENT_TIMEOUT
from .speech_llm_server import load_named, speech_llm_server

FIXTURES = Path(__file__).parents[1] / "fixtures"
SPEECH = FIXTURES / "audio" / "speech.wav"


def _greedy(family: str, case: str) -> list[int]:
    return json.loads((FIXTURES / family / "manifest.json").read_text())["cases"][case]["greedy"]


# served name -> (fixture family, transformers' greedy tokens for the clip as these tests ask for it)
MODELS = {
    "qwen3-asr-tiny": ("qwen3_asr", _greedy("qwen3_asr", "speech/English")),
    "granite-speech-tiny": ("granite_speech", _greedy("granite_speech", "speech")),
    "qwen3-asr-tiny-f32": ("qwen3_asr", _greedy("qwen3_asr", "speech/English")),  # llama.cpp's pair
}
PAIRS = {"qwen3-asr-tiny-f32"}  # served from a folder holding the text GGUF and its mmproj, named by the GGUF
NAME = "qwen3-asr-tiny"
DURATION = 82096 / 16_000


@pytest.fixture(scope="module")
def speech_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SpeechLLMTranscriber]:
    loaded = {}
    for name, (family, greedy) in MODELS.items():
        source = FIXTURES / family / "hf"
        if name in PAIRS:
            source = tmp_path_factory.mktemp("pair")
            write_pair(source)
        # served by its folder name (a pair's by its GGUF's); replies cut where transformers' reference stopped
        model = load_named(source, tmp_path_factory.mktemp("models") / name, len(greedy))
        if hasattr(model.prompter, "today"):  # Granite's prompt carries a date: the fixture's
            model.prompter.today = lambda: datetime.date(2025, 4, 9)
        loaded[name] = model
    return loaded


@pytest.fixture(scope="module")
def base_url(speech_models: dict[str, SpeechLLMTranscriber]) -> Iterator[str]:
    with speech_llm_server(list(speech_models.values())) as url:
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


def expected_text(speech_models: dict[str, SpeechLLMTranscriber], model: str = NAME) -> str:
    tokenizer = speech_models[model].task.engine.tokenizer
    return tokenizer.decode(MODELS[model][1], skip_special_tokens=True).strip()


def test_models_lists_whisper_and_the_speech_models(base_url: str) -> None:
    ids = [card["id"] for card in httpx.get(f"{base_url}/v1/models", timeout=CLIENT_TIMEOUT).json()["data"]]
    assert set(MODELS) <= set(ids) and "whisper-1" in ids


@pytest.mark.parametrize("model", sorted(MODELS))
def test_json_and_text_hold_the_greedy_transcript(model: str, base_url: str, speech_models) -> None:
    body = post(base_url, {"model": model}).json()
    assert body["text"] == expected_text(speech_models, model)
    assert body["usage"] == {"type": "duration", "seconds": 6}
    text = post(base_url, {"model": model, "response_format": "text"})
    assert text.status_code == 200 and text.text == expected_text(speech_models, model) + "\n"


@pytest.mark.parametrize("model", sorted(MODELS))
def test_verbose_json_has_the_language_and_one_segment_over_the_clip(model: str, base_url: str, speech_models):
    body = post(base_url, {"model": model, "response_format": "verbose_json"}).json()
    assert body["language"] == "english"
    assert body["duration"] == pytest.approx(DURATION, abs=1e-3)
    [segment] = body["segments"]
    expected = (0.0, expected_text(speech_models, model), MODELS[model][1])
    assert (segment["start"], segment["text"], segment["tokens"]) == expected
    assert segment["end"] == pytest.approx(DURATION, abs=1e-3)


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize(
    ("fmt", "cue"),
    [("srt", "1\n00:00:00,000 --> 00:00:05,131\n"), ("vtt", "WEBVTT\n\n00:00:00.000 --> 00:00:05.131\n")],
)
def test_srt_and_vtt_have_one_cue_over_the_clip(model: str, fmt: str, cue: str, base_url: str, speech_models):
    response = post(base_url, {"model": model, "response_format": fmt})
    assert response.status_code == 200
    assert response.text == f"{cue}{expected_text(speech_models, model)}\n\n"


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize(
    ("payload", "problem"),
    [(b"RIFF\x24\x00\x00\x00WAVEfmt ", "cannot decode"), (b"%PDF-1.7\n" * 40, "cannot decode")],
)
def test_a_bad_file_is_refused_naming_it(model: str, payload: bytes, problem: str, base_url: str) -> None:
    response = post(base_url, {"model": model}, payload, name="minutes.wav")
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
