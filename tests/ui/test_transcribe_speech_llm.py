"""The Transcribe pane with a speech LLM folder chosen through its "Choose model…" button: the speech LLM
(the tiny random-weight Qwen3-ASR of tests/fixtures/qwen3_asr, or Granite Speech of
tests/fixtures/granite_speech) replaces Whisper for the next drops, and its transcript shows as one segment
over the clip (the models give no timestamps)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from .drag import drop

FIXTURES = Path(__file__).parents[1] / "fixtures"
SPEECH = FIXTURES / "audio" / "speech.wav"
WAIT_MS = 60_000


@pytest.mark.parametrize("family", ["qwen3_asr", "granite_speech"])
def test_a_chosen_speech_llm_folder_transcribes_the_next_drop(family, qtbot, make_window, tmp_path):
    folder = FIXTURES / family / "hf"
    window = make_window(panes=("transcribe",))
    pane = window.pane("transcribe")
    pane.dialogs.folder_answer = None  # cancelled: nothing changes
    qtbot.mouseClick(pane.model_button, Qt.MouseButton.LeftButton)
    assert pane.service.model_path is None
    pane.dialogs.folder_answer = str(folder)
    qtbot.mouseClick(pane.model_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: pane.model_label.text().startswith("Model: hf · Device: CPU"), timeout=WAIT_MS)
    assert pane.model_label.text().endswith("· loaded") and pane.service.model_path == folder
    with qtbot.waitSignal(pane.transcription_finished, timeout=WAIT_MS) as outcome:
        drop(pane.drop_zone, [SPEECH])
    result = outcome.args[0]
    assert result.ok, result.error_message
    transcript = result.value.transcript
    assert [(s.start, s.end) for s in transcript.segments] == [(0.0, transcript.duration)]
    assert pane.segments.count() == 1 and abs(transcript.duration - 82096 / 16_000) < 1e-3


def test_a_folder_that_is_no_model_says_why(qtbot, make_window, tmp_path):
    window = make_window(panes=("transcribe",))
    pane = window.pane("transcribe")
    pane.dialogs.folder_answer = str(tmp_path)
    qtbot.mouseClick(pane.model_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "not available" in pane.model_label.text(), timeout=WAIT_MS)
    assert f"{tmp_path} is not a CTranslate2 Whisper model folder" in pane.model_label.text()
