"""The model picker in the chat's header: it lists the library's usable models with the loaded one shown,
and choosing one (a real click in its popup) loads it through the Models pane's transactional switch,
so a model that fails to load leaves the old one loaded and shown, with the reason in the chat."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from studio.fake_hub import make_tiny_gguf

from app.engine.config import EngineConfig
from app.ui.widgets.model_picker import NONE_LOADED

from .test_model_switch import EngineAt

WAIT_MS = 15_000
FIRST, SECOND, BROKEN, TRUNCATED = "tiny-first.gguf", "tiny-second.gguf", "tiny-fails.gguf", "tiny-cut.gguf"


@pytest.fixture
def models(home):
    folder = home / "models"
    folder.mkdir(parents=True)
    data = make_tiny_gguf(folder / FIRST)
    for name in (SECOND, BROKEN):
        (folder / name).write_bytes(data)
    (folder / TRUNCATED).write_bytes(data[: len(data) // 2])  # incomplete: never offered
    return folder


def _window(qtbot, make_window, make_context, made: list[EngineAt]):
    def factory(config: EngineConfig):
        if config.model.endswith(BROKEN):
            raise RuntimeError("CUDA out of memory while allocating the KV cache")
        made.append(EngineAt(config.model, name=config.model.rsplit("/", 1)[-1]))
        return made[-1]

    context = make_context(engine_factory=factory)
    window = make_window(context, panes=("chat", "models"))
    window.resize(1000, 650)
    window.show()
    qtbot.waitExposed(window)
    return context, window, window.pane("chat")


def _choose(qtbot, picker, name: str) -> None:
    """Open the picker's popup and click the row that names `name`."""
    row = _names(picker).index(name)
    picker.showPopup()
    view = picker.view()
    qtbot.waitUntil(view.isVisible, timeout=WAIT_MS)
    rect = view.visualRect(view.model().index(row, 0))
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def _names(picker) -> list[str]:
    """The models offered, by file name (a base model's row says so after its name)."""
    return [picker.itemText(i).removesuffix(" (base)") for i in range(picker.count())]


def _shown(picker) -> str:
    return picker.currentText().removesuffix(" (base)")


def test_choosing_a_model_in_the_chat_loads_it(qtbot, make_window, make_context, models):
    made: list[EngineAt] = []
    context, window, pane = _window(qtbot, make_window, make_context, made)
    picker = pane.model_picker
    window.load_model(str(models / FIRST))
    qtbot.waitUntil(lambda: _shown(picker) == FIRST, timeout=WAIT_MS)
    assert {FIRST, SECOND, BROKEN} <= set(_names(picker)) and TRUNCATED not in _names(picker)
    assert NONE_LOADED not in _names(picker)

    _choose(qtbot, picker, SECOND)
    qtbot.waitUntil(lambda: context.host.status.model == SECOND and _shown(picker) == SECOND,
                    timeout=WAIT_MS)
    assert [engine.path for engine in made] == [str(models / FIRST), str(models / SECOND)]
    assert made[0].closed and not made[1].closed  # the old one released once the new one is up
    assert context.dialogs.asked == []  # it fits in this machine's memory: nothing to ask

    pane.input.setPlainText("hello")
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as outcome:
        qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
    assert outcome.args[0].ok and made[1].requests  # the chat now talks to the chosen model


def test_a_model_that_fails_to_load_leaves_the_old_one_loaded_and_shown(qtbot, make_window, make_context, models):
    made: list[EngineAt] = []
    context, window, pane = _window(qtbot, make_window, make_context, made)
    picker = pane.model_picker
    window.load_model(str(models / FIRST))
    qtbot.waitUntil(lambda: _shown(picker) == FIRST, timeout=WAIT_MS)
    width = window.width()

    _choose(qtbot, picker, BROKEN)
    qtbot.waitUntil(lambda: bool(context.host.status.problem), timeout=WAIT_MS)
    status = context.host.status
    assert status.ready and status.model == FIRST and not made[-1].closed  # never left with nothing
    qtbot.waitUntil(lambda: "out of memory" in pane.model_hint.text(), timeout=WAIT_MS)
    assert _shown(picker) == FIRST and pane.send_button.isEnabled()
    assert window.width() == width  # the long error wraps in the pane


@pytest.fixture
def small_gpu(monkeypatch):
    """A GPU with 64 MiB free: the tiny models' KV cache at their full context does not fit in it."""
    from app.engine.plan import fit as fit_module

    gpu = fit_module.DeviceMemory("cuda", "Test GPU", 64 * 2**20, 80 * 2**20)
    monkeypatch.setattr(fit_module, "device_memory", lambda: gpu)
    return gpu


@pytest.mark.parametrize("load_anyway", [False, True])
def test_a_model_predicted_not_to_fit_asks_before_loading(qtbot, make_window, make_context, models, small_gpu,
                                                          load_anyway):
    from app.engine.plan.fit import WONT_FIT, shape_from_checkpoint
    from app.studio.fit_estimate import fit_at_context
    from app.studio.runtime import fit_options

    made: list[EngineAt] = []
    context, window, pane = _window(qtbot, make_window, make_context, made)
    picker, dialogs = pane.model_picker, context.dialogs
    window.load_model(str(models / FIRST))
    qtbot.waitUntil(lambda: _shown(picker) == FIRST, timeout=WAIT_MS)
    expected = fit_at_context(shape_from_checkpoint(models / SECOND), fit_options(context.settings), small_gpu)
    assert expected.verdict == WONT_FIT  # the premise: this GPU is too small for it
    dialogs.confirm_answer, dialogs.asked = load_anyway, []

    with qtbot.waitSignal(picker.fit_checked, timeout=WAIT_MS) as checked:
        _choose(qtbot, picker, SECOND)
    assert checked.args[0].value.verdict == WONT_FIT
    needed = f"{expected.breakdown.total / 2**30:.1f} GiB needed"
    assert dialogs.asked == [f"{SECOND} is predicted not to fit ({needed}). Load it anyway?"]
    if load_anyway:
        qtbot.waitUntil(lambda: context.host.status.model == SECOND and _shown(picker) == SECOND, timeout=WAIT_MS)
        assert [engine.path for engine in made] == [str(models / FIRST), str(models / SECOND)]
    else:  # nothing was loaded or unloaded, and the picker shows the loaded model again
        assert _shown(picker) == FIRST and context.host.status.model == FIRST
        assert [engine.path for engine in made] == [str(models / FIRST)] and not made[0].closed
        assert picker.isEnabled()
