"""Settings that cannot change by accident: the wheel, the API opened to the network, Ctrl+, to reach them."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QWidget

from app.studio.secrets import SERVER_API_KEY
from app.ui.widgets.lan_guard import GENERATE, KEEP_OPEN
from app.ui.widgets.settings_form import SettingsDialog


def _wheel(widget: QWidget, steps: int = 1) -> None:
    """One notch of the wheel over the middle of `widget`, as the pointer would deliver it."""
    centre = QPointF(widget.rect().center())
    event = QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(), QPoint(0, 120 * steps),
                        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def _dialog(qtbot, context) -> SettingsDialog:
    dialog = SettingsDialog(context.settings, context.secrets, dialogs=context.dialogs)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    return dialog


def test_the_wheel_changes_no_settings_field_it_passes_over(qtbot, make_context):
    dialog = _dialog(qtbot, make_context())
    seqs = dialog.form.editors["engine.max_num_seqs"].widget
    bind = dialog.form.editors["server.bind"].widget
    for _ in range(3):
        _wheel(seqs, -1)
        _wheel(bind, -1)
    assert (seqs.value(), bind.currentText()) == (32, "loopback")

    dialog.activateWindow()
    seqs.setFocus()
    qtbot.waitUntil(seqs.hasFocus)
    _wheel(seqs, 1)  # clicked into: the wheel is the user's choice now
    assert seqs.value() == 33
    assert seqs.focusPolicy() == Qt.FocusPolicy.StrongFocus  # the wheel alone never gives focus


def test_panes_guard_their_fields_too(qtbot, make_window):
    pane = make_window(panes=("server",)).pane("server")
    port = pane.port.value()
    _wheel(pane.port, 3)
    _wheel(pane.bind, -1)
    assert (pane.port.value(), pane.bind.currentData()) == (port, "loopback")


def test_saving_lan_without_a_key_asks_first_and_can_back_out(qtbot, make_context):
    context = make_context()
    dialog = _dialog(qtbot, context)
    dialog.form.editors["server.bind"].put("lan")
    context.dialogs.choice = None  # the user closes the question
    dialog._save()
    assert "no API key is required" in context.dialogs.asked[-1]
    assert context.settings.get("server.bind") == "loopback" and dialog.isVisible()

    context.dialogs.choice = KEEP_OPEN
    dialog._save()
    assert context.settings.get("server.bind") == "lan" and not context.settings.get("server.require_api_key")


def test_saving_lan_can_generate_the_key_it_suggests(qtbot, make_context):
    context = make_context()
    dialog = _dialog(qtbot, context)
    dialog.form.editors["server.bind"].put("lan")
    context.dialogs.choice = GENERATE
    dialog._save()
    key = context.secrets.get(SERVER_API_KEY)
    assert context.settings.get("server.bind") == "lan" and context.settings.get("server.require_api_key")
    assert key and key.startswith("pk-") and len(key) > 20
    assert dialog.result() == SettingsDialog.DialogCode.Accepted


def test_lan_with_a_key_required_is_not_questioned(qtbot, make_context):
    context = make_context()
    context.secrets.set(SERVER_API_KEY, "pk-existing")
    dialog = _dialog(qtbot, context)
    dialog.form.editors["server.bind"].put("lan")
    dialog.form.editors["server.require_api_key"].put(True)
    dialog._save()
    assert context.dialogs.asked == [] and context.settings.get("server.bind") == "lan"


def test_the_server_pane_asks_before_lan_without_a_key(qtbot, make_window):
    window = make_window(panes=("server",))
    pane, dialogs = window.pane("server"), window.context.dialogs
    lan = pane.bind.findData("lan")
    dialogs.choice = None
    pane.bind.setCurrentIndex(lan)
    pane.bind.activated.emit(lan)
    assert pane.bind.currentData() == "loopback" and len(dialogs.asked) == 1

    dialogs.choice = GENERATE
    pane.bind.setCurrentIndex(lan)
    pane.bind.activated.emit(lan)
    assert pane.bind.currentData() == "lan" and pane.require_key.isChecked()
    assert pane.api_key.text().startswith("pk-") and pane.options().api_key == pane.api_key.text()
    assert not pane.exposure.isVisible()


def test_ctrl_comma_opens_the_settings(qtbot, make_window):
    window = make_window(panes=("chat",))
    window.show()
    qtbot.waitExposed(window)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    qtbot.keyClick(window, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: window.settings_dialog is not None and window.settings_dialog.isVisible())
    window.settings_dialog.reject()
