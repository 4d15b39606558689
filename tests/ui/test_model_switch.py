"""A model switch that cannot leave the user with nothing: checked first, loaded before the old one goes,
the old one kept (or brought back) on failure, the error wrapped in the pane and elided in the status bar;
the library marks truncated files, the loaded model and base models."""

from __future__ import annotations

import dataclasses

import pytest
from PySide6.QtCore import Qt
from server.fakes import FakeEngine
from studio.fake_hub import make_tiny_gguf

from app.engine.config import EngineConfig
from app.studio.model_check import INCOMPLETE_HINT
from app.studio.runtime import ModelLoadError
from app.ui.models.library import NOTES_COLUMN

WAIT_MS = 15_000
GOOD, TRUNCATED = "tiny-good.gguf", "tiny-truncated.gguf"


@pytest.fixture
def models(home):
    folder = home / "models"
    folder.mkdir(parents=True)
    data = make_tiny_gguf(folder / GOOD)
    (folder / TRUNCATED).write_bytes(data[: len(data) * 2 // 3])  # an interrupted copy: header whole, tensors cut
    return folder


class EngineAt(FakeEngine):
    """Reports the file and device it was loaded for, as the real engine does."""

    def __init__(self, path: str, device: str = "cpu", **kwargs) -> None:
        super().__init__(**kwargs)
        self.path, self.device, self.closed = path, device, False

    @property
    def model(self):
        return dataclasses.replace(super().model, path=self.path, device=self.device)

    def close(self) -> None:
        self.closed = True


def _row_of(pane, name: str) -> int:
    return next(r for r in range(pane.entries.rowCount()) if pane.entries.entry(r).name == name)


def _models_window(qtbot, make_window, make_context, factory):
    context = make_context(engine_factory=factory)
    window = make_window(context, panes=("chat", "models"))
    pane = window.pane("models")
    qtbot.waitUntil(lambda: pane.entries.rowCount() >= 3, timeout=WAIT_MS)
    return context, window, pane


def test_a_truncated_file_is_refused_before_the_loaded_model_is_touched(qtbot, make_window, make_context, models):
    made: list[EngineAt] = []

    def factory(config: EngineConfig):
        made.append(EngineAt(config.model, name=config.model.rsplit("/", 1)[-1]))
        return made[-1]

    context, window, pane = _models_window(qtbot, make_window, make_context, factory)
    window.resize(900, 600)
    window.show()
    qtbot.waitExposed(window)
    window.load_model(str(models / GOOD))
    assert context.host.status.ready and len(made) == 1
    width = window.width()

    outcome = context.host.load(EngineConfig(model=str(models / TRUNCATED))).result()
    assert isinstance(outcome.error, ModelLoadError)
    assert len(made) == 1 and not made[0].closed  # never loaded, and the old engine was never closed
    status = context.host.status
    assert status.ready and status.model == GOOD and INCOMPLETE_HINT in status.problem
    qtbot.waitUntil(lambda: "is still loaded" in window.status.state.full_text(), timeout=WAIT_MS)
    assert window.status.model.text() == f"Model: {GOOD}"
    assert window.status.state.property("error") is True and "is still loaded" in window.status.state.full_text()
    qtbot.wait(50)  # let the layout settle on the long text
    assert window.width() == width  # the status bar elided the long error
    shown = window.status.state.text()
    assert shown.endswith("…") and len(shown) < len(window.status.state.full_text())
    assert INCOMPLETE_HINT in pane.notice.text() and pane.notice.wordWrap()


def test_the_library_marks_truncated_loaded_and_base_models(qtbot, make_window, make_context, models):
    _, _, pane = _models_window(qtbot, make_window, make_context, lambda config: EngineAt(config.model))
    truncated = pane.entries.entry(_row_of(pane, TRUNCATED))
    assert truncated.incomplete and truncated.architecture == "llama"  # the header is fine: it is the tensors
    notes = pane.entries.index(_row_of(pane, TRUNCATED), NOTES_COLUMN).data()
    assert notes.startswith(INCOMPLETE_HINT)
    pane.table.selectRow(_row_of(pane, TRUNCATED))
    assert not pane.load_button.isEnabled() and pane.delete_button.isEnabled()

    good_row = _row_of(pane, GOOD)
    assert pane.entries.index(good_row, NOTES_COLUMN).data() == "base"  # no chat template in the file
    pane.table.selectRow(good_row)
    qtbot.mouseClick(pane.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "loaded" in pane.entries.index(_row_of(pane, GOOD), NOTES_COLUMN).data(),
                    timeout=WAIT_MS)
    assert pane.entries.index(_row_of(pane, GOOD), NOTES_COLUMN).data() == "loaded · base"
    assert pane.entries.index(_row_of(pane, GOOD), 0).data(Qt.ItemDataRole.FontRole).bold()


def test_a_switch_loads_the_new_model_before_closing_the_old(qtbot, make_context, models):
    events: list[str] = []

    def factory(config: EngineConfig):
        events.append(f"made {config.model.rsplit('/', 1)[-1]}")
        return EngineAt(config.model)

    context = make_context(engine_factory=factory)
    context.host.subscribe(lambda status: events.append(status.state))
    context.host.load(EngineConfig(model=str(models / GOOD))).result()
    first = context.host.client
    second_config = EngineConfig(model=str(models / GOOD))
    context.host.load(second_config).result()
    assert first.closed and context.host.client is not first
    assert events[-4:] == ["loading", f"made {GOOD}", "unloading", "ready"]  # made while the old one served


def test_on_the_gpu_a_failed_switch_brings_the_old_model_back(qtbot, make_context, models):
    made: list[EngineAt] = []

    def factory(config: EngineConfig):
        if config.model == "broken":
            raise MemoryError("out of GPU memory")
        made.append(EngineAt(config.model, device="cuda"))
        return made[-1]

    context = make_context(engine_factory=factory)
    context.host.load(EngineConfig(model=str(models / GOOD))).result()
    assert isinstance(context.host.load(EngineConfig(model="broken")).result().error, ModelLoadError)
    assert made[0].closed  # released first: the new model needed the GPU memory
    assert len(made) == 2 and context.host.client is made[1]  # ... and loaded again after the failure
    status = context.host.status
    assert status.ready and "not enough memory" in status.problem and "is still loaded" in status.message
