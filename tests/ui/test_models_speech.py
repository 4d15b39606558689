"""The Models pane and a Granite Speech folder (the tiny random-weight fixture of tests/fixtures/granite_speech):
the row and the details say its job is transcription, and will-it-fit has an Audio row counting its conformer,
Q-Former projector and LoRA adapter apart from the text weights, the same numbers `paddock fit` gives."""

from __future__ import annotations

import shutil
from pathlib import Path

from app.engine.plan.fit import FitOptions, check_fit, shape_from_checkpoint
from app.ui.models.library import NOTES_COLUMN
from app.ui.widgets.fit_view import AUDIO_ROW, VISION_ROW

from .test_models_pane import WAIT_MS, _models_window, _row_of

GRANITE = Path(__file__).parents[1] / "fixtures" / "granite_speech" / "hf"


def test_a_granite_speech_folder_is_listed_for_transcription_with_its_audio_side(
    qtbot, make_window, make_context, home
):
    folder = home / "models" / "ibm" / "granite-speech-tiny"
    shutil.copytree(GRANITE, folder)
    _window, pane = _models_window(qtbot, make_window, make_context)
    row = _row_of(pane, "ibm/granite-speech-tiny")
    assert pane.entries.index(row, 2).data() == "GraniteSpeechForConditionalGeneration"
    assert "transcription" in pane.entries.index(row, NOTES_COLUMN).data()
    with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS) as checked:
        pane.table.selectRow(row)
    report = checked.args[0].value.report
    assert "Job: transcription. It is a Granite Speech speech model" in pane.details.text()
    assert "--asr-model" in pane.details.text()

    expected = check_fit(shape_from_checkpoint(folder), FitOptions())  # what `paddock fit` and the engine count
    b = report.breakdown
    assert report.audio_source == "Granite Speech in granite-speech-tiny/*.safetensors"
    assert (b.weights, b.audio_weights, b.audio_activations) == (
        expected.breakdown.weights, expected.breakdown.audio_weights, expected.breakdown.audio_activations
    )
    # the text model's weights, and beside them the encoder + projector (F32, as stored) with the adapter
    adapter = 2 * (4 * 64 + 64 * 4) * 4 + 2 * (4 * 64 + 32 * 4) * 4  # two layers' q_proj and v_proj A, B
    assert b.audio_weights > adapter and b.audio_activations > 0
    shape = shape_from_checkpoint(folder)
    assert shape.audio.adapter_bytes == adapter and b.audio_weights == shape.audio.weight_bytes + adapter
    assert pane.fit.form.isRowVisible(AUDIO_ROW) and not pane.fit.form.isRowVisible(VISION_ROW)
    assert "per minute of audio" in pane.fit.parts["audio"].text()
