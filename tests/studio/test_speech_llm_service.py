"""The Transcribe pane's service with a speech LLM folder chosen (Qwen3-ASR, Granite Speech): the speech LLM
runs (not Whisper), and its transcript exports like Whisper's. The tiny random-weight fixtures transcribe
nothing real: their text is the decoded greedy tokens tests/engine/audio/ checks against transformers."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from app.engine.tasks.audio import Transcriber
from app.engine.tasks.speech_llm import SpeechLLMTranscriber, is_speech_llm_folder
from app.studio.transcription import TranscriptionService, export_transcript

FIXTURES = Path(__file__).parents[1] / "fixtures"
ASR = FIXTURES / "qwen3_asr" / "hf"
GRANITE = FIXTURES / "granite_speech" / "hf"
SPEECH = FIXTURES / "audio" / "speech.wav"
# folder -> (family, the case whose greedy tokens transformers gave for the clip with English asked for);
# granite_speech/gguf holds llama.cpp's pair (text GGUF + mmproj) of the same model
CASES = {"qwen3_asr/hf": ("qwen3_asr", "speech/English"), "granite_speech/hf": ("granite_speech", "speech"),
         "granite_speech/gguf": ("granite_speech", "speech")}  # fmt: skip


@pytest.mark.parametrize("folder", sorted(CASES))
def test_a_speech_llm_folder_transcribes_with_the_speech_llm(folder: str, tmp_path: Path) -> None:
    family, case = CASES[folder]
    greedy = json.loads((FIXTURES / family / "manifest.json").read_text())["cases"][case]["greedy"]
    service = TranscriptionService(model_path=FIXTURES / folder, device="cpu")
    transcriber = service.transcriber()
    assert isinstance(transcriber, SpeechLLMTranscriber) and transcriber.device == "cpu"
    transcriber.max_reply_tokens = len(greedy)
    if hasattr(transcriber.prompter, "today"):  # Granite's prompt carries a date: the fixture's
        transcriber.prompter.today = lambda: datetime.date(2025, 4, 9)
    transcript = service.transcribe_file(SPEECH, language="en")
    text = transcriber.task.engine.tokenizer.decode(greedy, skip_special_tokens=True).strip()
    assert transcript.text == text and transcript.language == "en"
    vtt = export_transcript(transcript, tmp_path / "speech.vtt").read_text()
    assert vtt == f"WEBVTT\n\n00:00:00.000 --> 00:00:05.131\n{text}\n\n"


def test_other_folders_stay_whisper(tmp_path: Path) -> None:
    assert not is_speech_llm_folder(tmp_path)  # no config.json
    (tmp_path / "config.json").write_text("{not json")
    assert not is_speech_llm_folder(tmp_path)
    (tmp_path / "config.json").write_text('{"architectures": ["WhisperForConditionalGeneration"]}')
    assert not is_speech_llm_folder(tmp_path)
    assert is_speech_llm_folder(ASR) and is_speech_llm_folder(GRANITE)
    pair = FIXTURES / "granite_speech" / "gguf"
    assert is_speech_llm_folder(pair) and is_speech_llm_folder(pair / "granite-speech-tiny-f32.gguf")
    assert not is_speech_llm_folder(FIXTURES / "families" / "qwen3" / "qwen3-kquants.gguf")  # no mmproj
    service = TranscriptionService(device="cpu")  # the embedded tiny.en, not loaded by this
    assert isinstance(service.transcriber(), Transcriber)


def test_a_qwen3_asr_gguf_pair_transcribes_and_is_listed_for_transcription(tmp_path: Path) -> None:
    """llama.cpp's pair for the Qwen3-ASR fixture (tests/qwen3_asr_pair.py writes it): the Transcribe pane
    runs it as the folder, and the Library lists its text GGUF with the job and audio side its mmproj gives."""
    from qwen3_asr_pair import write_pair

    from app.studio.library import describe_gguf

    path = write_pair(tmp_path)
    assert is_speech_llm_folder(tmp_path) and is_speech_llm_folder(path)
    cases = json.loads((FIXTURES / "qwen3_asr" / "manifest.json").read_text())["cases"]
    greedy = cases["speech/English"]["greedy"]
    service = TranscriptionService(model_path=tmp_path, device="cpu")
    transcriber = service.transcriber()
    assert isinstance(transcriber, SpeechLLMTranscriber)
    transcriber.max_reply_tokens = len(greedy)
    transcript = service.transcribe_file(SPEECH, language="en")
    text = transcriber.task.engine.tokenizer.decode(greedy, skip_special_tokens=True).strip()
    assert transcript.text == text
    entry = describe_gguf((path,), path.stem)
    assert entry.error is None and entry.job == "transcription" and entry.vision is None
    assert (entry.shape.audio.family, entry.shape.audio.source) == (
        "Qwen3-ASR",
        "mmproj-qwen3-asr-tiny-f32.gguf",
    )
