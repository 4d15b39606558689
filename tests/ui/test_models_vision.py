"""The Models pane and a GGUF repo with mmproj files (on the local imitation of the hub): the
model is offered with its vision projector ticked, the fit before the download has a Vision row,
both files land beside each other, and the library row says the model takes images."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from studio.fake_hub import FakeHub

from app.engine.plan.fit import FitOptions, check_fit, shape_from_checkpoint
from app.studio.downloads import model_folder
from app.ui.models.library import NOTES_COLUMN

from .test_models_pane import WAIT_MS, _models_window, _open_hub, _row_of

FIXTURES = Path(__file__).parents[1] / "fixtures"
GEMMA = (FIXTURES / "families" / "gemma3" / "gemma3-f16.gguf").read_bytes()
MMPROJ = (FIXTURES / "vision" / "gemma3" / "mmproj-gemma3.gguf").read_bytes()
REPO, MODEL, PROJECTOR = "acme/gemma-vision-GGUF", "gemma-3-tiny-Q8_0.gguf", "mmproj-gemma-3-tiny-F16.gguf"


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub()
    fake.add_repo(REPO, {MODEL: GEMMA, PROJECTOR: MMPROJ, "mmproj-gemma-3-tiny-F32.gguf": MMPROJ + b"\0" * 64},
                  tags=("gguf",), downloads=100)
    fake.serve(monkeypatch)
    yield fake
    fake.stop()


def test_a_gguf_comes_with_its_mmproj_and_is_listed_as_taking_images(qtbot, make_window, make_context, hub, home):
    _window, pane = _models_window(qtbot, make_window, make_context)
    browser = _open_hub(qtbot, pane)  # the repo's only model is chosen, and its fit checked
    assert [f.path for f in browser.chosen] == [MODEL, PROJECTOR]
    assert not browser.with_vision.isHidden() and browser.with_vision.isChecked()
    assert PROJECTOR in browser.with_vision.text() and "reads images" in browser.with_vision.text()
    assert f"Selected: {MODEL} + {PROJECTOR} (vision)" in browser.selection.text()
    report = browser.fit.report
    assert report.vision_source == PROJECTOR and report.breakdown.vision_weights > 0
    assert browser.fit.form.isRowVisible(1) and PROJECTOR in browser.fit.parts["vision"].text()

    with qtbot.waitSignal(browser.fit_checked, timeout=WAIT_MS):  # unticked: the model alone, no Vision row
        browser.with_vision.setChecked(False)
    assert [f.path for f in browser.chosen] == [MODEL] and "(vision)" not in browser.selection.text()
    assert browser.fit.report.vision_source is None and not browser.fit.form.isRowVisible(1)
    with qtbot.waitSignal(browser.fit_checked, timeout=WAIT_MS):
        browser.with_vision.setChecked(True)

    with qtbot.waitSignal(browser.download_finished, timeout=WAIT_MS) as finished, \
            qtbot.waitSignal(pane.listed, timeout=WAIT_MS):
        qtbot.mouseClick(browser.download_button, Qt.MouseButton.LeftButton)
    assert finished.args[0].ok
    folder = model_folder(home / "models", REPO)
    assert sorted(p.name for p in folder.iterdir()) == [MODEL, PROJECTOR]
    names = [pane.entries.entry(r).name for r in range(pane.entries.rowCount())]
    assert f"{REPO}/{MODEL}" in names and not [n for n in names if "mmproj" in n]  # not a model of its own
    row = _row_of(pane, f"{REPO}/{MODEL}")
    assert "takes images" in pane.entries.index(row, NOTES_COLUMN).data()
    with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS) as checked:
        pane.table.selectRow(row)
    local = checked.args[0].value.report
    expected = check_fit(shape_from_checkpoint(folder / MODEL), FitOptions())
    assert local.vision_source == PROJECTOR and local.breakdown.vision == expected.breakdown.vision > 0
    assert pane.fit.form.isRowVisible(1) and f"Takes images: its vision tower is {PROJECTOR}" in pane.details.text()
