"""The fit view's "Audio" row: shown, with the tower's weights and its working set per 30 s clip, for a
Gemma 4 folder with audio (tests/fixtures/gemma4_audio), hidden for a model without audio."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.engine.plan.device import GiB
from app.engine.plan.fit import DeviceMemory, FitOptions, check_fit, shape_from_checkpoint
from app.ui.widgets.fit_view import AUDIO_ROW, FitView

HF = Path(__file__).parents[1] / "fixtures" / "gemma4_audio" / "hf"


def test_the_fit_view_shows_an_audio_row_only_for_a_model_with_audio(qtbot):
    view = FitView()
    qtbot.addWidget(view)
    device = DeviceMemory("cuda", "Test GPU", 1 * GiB, 8 * GiB)
    shape = shape_from_checkpoint(HF)
    view.show_report(check_fit(shape, FitOptions(context_length=256), device))
    assert view.form.isRowVisible(AUDIO_ROW)
    assert "in hf/*.safetensors" in view.parts["audio"].text() and "per 30 s clip" in view.parts["audio"].text()
    view.show_report(check_fit(replace(shape, audio=None), FitOptions(context_length=256), device))
    assert not view.form.isRowVisible(AUDIO_ROW)
