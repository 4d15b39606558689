"""Gemma 4 (with an audio tower) as a transcriber (`paddock serve --asr-model`, the Transcribe pane), on
the tiny random-weight fixture of tests/fixtures/gemma4_audio (make_gemma4_audio_reference.py).

The prompt is the model card's speech-recognition request in the model's own chat template, the clip's
audio tokens where the template writes `<|audio|>`: its ids and the greedy reply equal transformers'.
Random weights transcribe nothing real: the transcript is the decoded greedy tokens. Clips over the
model's 30 s go window by window, one segment each.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.engine.tasks.audio import decode_audio
from app.engine.tasks.gemma4_asr import Gemma4AsrPrompter, asr_instruction
from app.engine.tasks.speech_llm import SpeechLLMTranscriber, is_speech_llm_folder

FIXTURES = Path(__file__).parents[2] / "fixtures"
HF = FIXTURES / "gemma4_audio" / "hf"
CLIP = FIXTURES / "audio" / "speech.wav"
ASR = json.loads((FIXTURES / "gemma4_audio" / "manifest.json").read_text())["asr"]


@pytest.fixture(scope="module")
def transcriber() -> SpeechLLMTranscriber:
    model = SpeechLLMTranscriber.load(HF, device="cpu")
    model.max_reply_tokens = len(ASR["greedy"])
    return model


def test_a_gemma4_folder_with_audio_is_a_speech_model(transcriber):
    assert is_speech_llm_folder(HF)
    assert not is_speech_llm_folder(FIXTURES / "gemma4_vision" / "hf")  # Gemma 4 without audio
    assert isinstance(transcriber.prompter, Gemma4AsrPrompter)


def test_prompt_and_greedy_reply_equal_transformers(transcriber):
    ids, reply = transcriber.reply_ids(decode_audio(CLIP), ASR["language"], min_tokens=len(ASR["greedy"]))
    assert ids == ASR["token_ids"]
    assert reply == ASR["greedy"]


def test_the_instruction_names_the_language_or_asks_for_the_clips_own():
    assert asr_instruction("de").startswith(
        "Transcribe the following speech segment in German into German text."
    )
    assert asr_instruction(None).startswith(
        "Transcribe the following speech segment in its original language."
    )
    assert "write the digits" in asr_instruction(None)


def test_context_goes_in_a_system_turn(transcriber):
    clip = transcriber.prompter.audio_input(decode_audio(CLIP))
    plain = transcriber.prompter.prompt_ids(clip, "en")
    with_context = transcriber.prompter.prompt_ids(clip, "en", "Names: Paddock.")
    text = transcriber.task.engine.tokenizer.decode(with_context[: len(with_context) - len(plain) + 3])
    assert "<|turn>system\nNames: Paddock.<turn|>" in text


def test_transcript_is_the_decoded_reply_in_one_segment(transcriber):
    transcript = transcriber.transcribe(CLIP, language="English")
    text = transcriber.task.engine.tokenizer.decode(ASR["greedy"], skip_special_tokens=True).strip()
    assert (transcript.text, transcript.language) == (text, "en")
    [segment] = transcript.segments
    assert (segment.start, segment.end, segment.tokens) == (0.0, 5.131, ASR["greedy"])


def test_long_audio_goes_in_windows_of_the_models_30_s(transcriber, monkeypatch, tmp_path):
    seen = []

    def reply_ids(samples, language, prompt, cancel=None):
        seen.append(samples.size)
        return [], transcriber.task.engine.tokenizer.encode(f"w{len(seen)}", add_special_tokens=False)

    monkeypatch.setattr(transcriber, "reply_ids", reply_ids)
    import wave

    path = tmp_path / "long.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(16_000)
        out.writeframes(np.zeros(65 * 16_000 + 800, np.int16).tobytes())  # 65.05 s
    transcript = transcriber.transcribe(path)
    assert seen == [480_000, 480_000, 80_800]
    assert [(s.start, s.end, s.text) for s in transcript.segments] == [
        (0.0, 30.0, "w1"), (30.0, 60.0, "w2"), (60.0, 65.05, "w3")
    ]  # fmt: skip
    assert transcript.text == "w1 w2 w3" and transcript.language == ""
    seen.clear()
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(16_000)
        out.writeframes(np.zeros(30 * 16_000 + 800, np.int16).tobytes())  # 30.05 s: the tail holds no word
    assert [s.text for s in transcriber.transcribe(path).segments] == ["w1"] and seen == [480_000]
