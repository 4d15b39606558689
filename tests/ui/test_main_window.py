"""The main window: panes from the registry, the status bar following the model, settings, errors as sentences."""

from __future__ import annotations

import json
import socket

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QLabel
from server.fakes import FakeEngine

from app.engine.config import EngineConfig
from app.studio.settings import SETTINGS
from app.ui.main import configure_application
from app.ui.panes import PANES, PaneSpec
from app.ui.widgets.settings_form import SettingsDialog, SettingsForm

WAIT_MS = 10_000


def test_window_shows_every_registered_pane_and_switches_between_them(qtbot, make_window):
    window = make_window()
    assert window.windowTitle() == "Paddock Studio"
    titles = [window.navigation.item(i).text() for i in range(window.navigation.count())]
    assert titles == [spec.title for spec in PANES] and titles[:4] == ["Chat", "Compare", "Models", "Server"]
    window.navigation.setCurrentRow(3)
    assert window.stack.currentWidget() is window.pane("server")
    window.show_pane("compare")
    assert window.stack.currentWidget() is window.pane("compare")


def test_a_new_pane_is_one_registry_entry(qtbot, make_window, make_context):
    extra = PaneSpec("notes", "Notes", lambda ctx: QLabel(f"history at {ctx.paths.history_db.name}"))
    window = make_window(make_context(FakeEngine()), panes=("chat",))
    window._add_pane(extra)
    assert window.navigation.item(1).text() == "Notes"
    assert window.pane("notes").text() == "history at history.sqlite3"


def test_status_bar_follows_loading_and_shows_what_is_loaded(qtbot, make_window, make_context):
    engines = {"good.gguf": FakeEngine(name="good", context_length=8192)}

    def factory(config: EngineConfig):
        if config.model not in engines:
            raise ValueError(f"{config.model} is not a GGUF file (bad magic)")
        return engines[config.model]

    window = make_window(make_context(engine_factory=factory), panes=("chat",))
    bar = window.status
    assert bar.model.text() == "Model: none" and "Memory:" in bar.memory.text()
    window.load_model("good.gguf")
    qtbot.waitUntil(lambda: bar.model.text() == "Model: good", timeout=WAIT_MS)
    assert (bar.quantization.text(), bar.context.text(), bar.device.text()) == (
        f"Quant: {engines['good.gguf'].model.quantization}", "Context: 8,192 tokens", "Device: cpu")
    assert "KV" in bar.memory.text() and "RAM" in bar.memory.text()
    window.load_model("corrupt.gguf")
    qtbot.waitUntil(lambda: "Could not load" in bar.state.full_text(), timeout=WAIT_MS)
    assert "bad magic" in bar.state.full_text() and bar.state.property("error") is True
    assert bar.model.text() == "Model: good"  # a failed switch keeps the model that was loaded
    assert "bad magic" in window.pane("chat").model_hint.text()


def test_an_error_in_a_callback_is_shown_as_a_sentence(qtbot, make_window):
    window = make_window(panes=("chat",))

    def broken() -> None:
        raise RuntimeError("the disk is full")

    window.context.worker.bridge.post(broken)
    qtbot.waitUntil(lambda: "the disk is full" in window.status.state.text(), timeout=WAIT_MS)
    assert window.status.state.text() == "Something went wrong: the disk is full"


def test_settings_form_is_generated_from_the_declarations_and_saves(qtbot, make_context):
    context = make_context()
    form = SettingsForm(context.settings)
    qtbot.addWidget(form)
    assert set(form.editors) == {s.key for s in SETTINGS}
    form.editors["server.port"].put(9123)
    form.editors["engine.device"].put("cpu")
    form.editors["chat.system_prompt"].put("Be kind.")
    assert form.apply()
    saved = json.loads(context.paths.settings_file.read_text())
    assert saved["server.port"] == 9123 and saved["engine.device"] == "cpu"
    assert saved["chat.system_prompt"] == "Be kind." and "chat.temperature" not in saved  # only changes

    dialog = SettingsDialog(context.settings, context.secrets)
    qtbot.addWidget(dialog)
    assert dialog.form.editors["server.port"].get() == 9123
    dialog.keys.fields["openrouter_api_key"].setText("sk-or-123")
    dialog._save()
    assert context.secrets.get("openrouter_api_key") == "sk-or-123" and dialog.result() == SettingsDialog.Accepted
    assert context.secrets.get("hf_token") is None  # a field left empty keeps what is stored


def test_a_broken_settings_file_is_reported_in_the_form(qtbot, make_context, home):
    (home / "config").mkdir(parents=True)
    (home / "config" / "settings.json").write_text('{"server.port": "eighty"}')
    form = SettingsForm(make_context().settings)
    qtbot.addWidget(form)
    assert "server.port" in form.problems.text() and "using the default" in form.problems.text()


def test_new_chats_start_from_the_chat_settings(qtbot, make_window, make_context):
    context = make_context(FakeEngine())
    context.settings.update({"chat.system_prompt": "Be brief.", "chat.temperature": 0.3})
    window = make_window(context, panes=("chat",))
    pane = window.pane("chat")
    assert pane.system_prompt.toPlainText() == "Be brief." and pane.sampling.settings().temperature == 0.3


def test_the_application_names_its_desktop_entry(qapp):
    configure_application(qapp)
    assert QGuiApplication.desktopFileName() == "paddock-studio"
    assert qapp.applicationName() == "Paddock Studio"


def test_closing_the_window_stops_the_api(qtbot, make_window):
    window = make_window(panes=("server",), threaded=True)
    pane = window.pane("server")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        pane.port.setValue(probe.getsockname()[1])
    qtbot.mouseClick(pane.toggle, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: pane.server.running, timeout=WAIT_MS)
    window.close()
    assert not window.context.server.running and window.context.host.client is None


def test_help_about_tells_the_version_the_engine_and_where_things_are_kept(qtbot, make_window):
    from app import __version__

    window = make_window(panes=("chat",))
    qtbot.waitUntil(lambda: window.gpu is not None, timeout=WAIT_MS)  # probed on the worker at start
    help_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")
    assert window.about_action in help_menu.actions()
    window.about_action.trigger()
    dialog = window.about_dialog
    assert dialog is not None and dialog.isVisible()
    text = dialog.text.text()
    assert f"<td>{__version__}</td>" in text and str(window.context.paths.settings_file) in text
    assert str(window.context.models_dir) in text and "Apache-2.0" in text
    assert f"{window.gpu.backend}: " in text  # the engine line: the same probe as `paddock --version`
    window.about_action.trigger()  # a second click raises the open one
    assert window.about_dialog is dialog
    dialog.reject()
