"""The Transcribe pane's service with a Qwen3-ASR folder chosen: the speech LLM runs (not Whisper),
and its transcript exports like Whisper's. The tiny random-weight fixture transcribes nothing real:
its text is the decoded greedy tokens tests/engine/audio/test_qwen3_asr.py checks against transformers."""

from __future__ import annotations

import json
from pathlib import Path

from app.engine.tasks.audio import Transcriber
from app.engine.tasks.speech_llm import SpeechLLMTranscriber, is_speech_llm_folder
from app.studio.transcription import TranscriptionService, export_transcript

FIXTURES = Path(__file__).parents[1] / "fixtures"
ASR = FIXTURES / "qwen3_asr" / "hf"
SPEECH = FIXTURES / "audio" / "speech.wav"
GREEDY = json.loads((FIXTURES / "qwen3_asr" / "manifest.json").read_text())["cases"]["speech/English"]["greedy"]


def test_a_qwen3_asr_folder_transcribes_with_the_speech_llm(tmp_path: Path) -> None:
    service = TranscriptionService(model_path=ASR, device="cpu")
    transcriber = service.transcriber()
    assert isinstance(transcriber, SpeechLLMTranscriber) and transcriber.device == "cpu"
    transcriber.max_reply_tokens = len(GREEDY)
    transcript = service.transcribe_file(SPEECH, language="en")
    text = transcriber.task.engine.tokenizer.decode(GREEDY, skip_special_tokens=True).strip()
    assert transcript.text == text and transcript.language == "en"
    vtt = export_transcript(transcript, tmp_path / "speech.vtt").read_text()
    assert vtt == f"WEBVTT\n\n00:00:00.000 --> 00:00:05.131\n{text}\n\n"


def test_other_folders_stay_whisper(tmp_path: Path) -> None:
    assert not is_speech_llm_folder(tmp_path)  # no config.json
    (tmp_path / "config.json").write_text("{not json")
    assert not is_speech_llm_folder(tmp_path)
    (tmp_path / "config.json").write_text('{"architectures": ["WhisperForConditionalGeneration"]}')
    assert not is_speech_llm_folder(tmp_path)
    assert is_speech_llm_folder(ASR)
    service = TranscriptionService(device="cpu")  # the embedded tiny.en, not loaded by this
    assert isinstance(service.transcriber(), Transcriber)
