"""The Transcribe pane with a speech LLM folder chosen through its "Choose model…" button: the speech LLM
(the tiny random-weight fixtures of tests/fixtures/qwen3_asr, granite_speech and gemma4_audio) replaces
Whisper for the next drops, and its transcript shows as one segment over the clip (the models give no
timestamps)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from .drag import drop

FIXTURES = Path(__file__).parents[1] / "fixtures"
SPEECH = FIXTURES / "audio" / "speech.wav"
WAIT_MS = 60_000


def _choose_and_drop(qtbot, pane, folder: Path, max_reply_tokens: int | None = None):
    """Choose `folder` through the button, wait for the label to name the loaded model, drop the clip;
    the finished transcript."""
    pane.dialogs.folder_answer = str(folder)
    qtbot.mouseClick(pane.model_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: pane.model_label.text().startswith("Model: hf · Device: CPU"), timeout=WAIT_MS)
    assert pane.model_label.text().endswith("· loaded") and pane.service.model_path == folder
    if max_reply_tokens is not None:  # random weights: a short reply is enough
        pane.service.transcriber().max_reply_tokens = max_reply_tokens
    with qtbot.waitSignal(pane.transcription_finished, timeout=WAIT_MS) as outcome:
        drop(pane.drop_zone, [SPEECH])
    result = outcome.args[0]
    assert result.ok, result.error_message
    transcript = result.value.transcript
    assert [(s.start, s.end) for s in transcript.segments] == [(0.0, transcript.duration)]
    assert pane.segments.count() == 1 and abs(transcript.duration - 82096 / 16_000) < 1e-3
    return transcript


@pytest.mark.parametrize("family", ["qwen3_asr", "granite_speech"])
def test_a_chosen_speech_llm_folder_transcribes_the_next_drop(family, qtbot, make_window, tmp_path):
    window = make_window(panes=("transcribe",))
    pane = window.pane("transcribe")
    pane.dialogs.folder_answer = None  # cancelled: nothing changes
    qtbot.mouseClick(pane.model_button, Qt.MouseButton.LeftButton)
    assert pane.service.model_path is None
    _choose_and_drop(qtbot, pane, FIXTURES / family / "hf")


def test_a_folder_that_is_no_model_says_why(qtbot, make_window, tmp_path):
    window = make_window(panes=("transcribe",))
    pane = window.pane("transcribe")
    pane.dialogs.folder_answer = str(tmp_path)
    qtbot.mouseClick(pane.model_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "not available" in pane.model_label.text(), timeout=WAIT_MS)
    assert f"{tmp_path} is not a CTranslate2 Whisper model folder" in pane.model_label.text()


def test_the_chosen_model_is_kept_for_the_next_start(qtbot, make_window, make_context, tmp_path):
    """The choice goes into `transcribe.model` (saved: will-it-fit counts a speech LLM beside the chat model
    from there), and the pane of the next start begins with it."""
    window = make_window(panes=("transcribe",))
    pane = window.pane("transcribe")
    pane.dialogs.folder_answer = str(tmp_path)
    qtbot.mouseClick(pane.model_button, Qt.MouseButton.LeftButton)
    assert window.context.settings.get("transcribe.model") == str(tmp_path)
    qtbot.waitUntil(lambda: "not available" in pane.model_label.text(), timeout=WAIT_MS)
    restarted = make_window(context=make_context(), panes=("transcribe",)).pane("transcribe")
    assert restarted.service.model_path == tmp_path
    qtbot.waitUntil(lambda: "not available" in restarted.model_label.text(), timeout=WAIT_MS)


def test_a_chosen_gemma4_folder_with_audio_transcribes_the_next_drop(qtbot, make_window):
    """A Gemma 4 folder with an audio tower (tests/fixtures/gemma4_audio) is taken as a speech LLM too;
    the model label names it once loaded, and a clip under its 30 s comes back as one segment."""
    window = make_window(panes=("transcribe",))
    transcript = _choose_and_drop(qtbot, window.pane("transcribe"), FIXTURES / "gemma4_audio" / "hf", 4)
    assert len(transcript.segments[0].tokens) == 4
