"""The theme setting applies to the open window at once: no restart."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QDialogButtonBox

from app.ui.theme import dark_palette, follow_theme

WINDOW = QPalette.ColorRole.Window
DARK = dark_palette().color(WINDOW).name()


@pytest.fixture
def app_look(qapp):
    """The application's style, palette and style sheet as they were, restored for the tests after this one."""
    style, palette, sheet = qapp.style().name(), qapp.palette(), qapp.styleSheet()
    yield qapp
    qapp.setStyle(style)
    qapp.setPalette(palette)
    qapp.setStyleSheet(sheet)


def _save_theme(qtbot, window, choice: str) -> None:
    """Choose `choice` in the Settings dialog and click Save, as the user does."""
    window.open_settings()
    dialog = window.settings_dialog
    dialog.form.editors["appearance.theme"].widget.setCurrentText(choice)
    save = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Save)
    qtbot.mouseClick(save, Qt.MouseButton.LeftButton)
    assert not dialog.isVisible()


def test_a_theme_saved_in_settings_recolours_the_open_window(qtbot, app_look, make_window):
    window = make_window(panes=("chat", "server"))
    stop = follow_theme(app_look, window.context.settings)
    try:
        window.show()
        assert window.palette().color(WINDOW).name() != DARK  # the default: system, light here
        _save_theme(qtbot, window, "dark")
        assert app_look.palette().color(WINDOW).name() == DARK
        assert window.pane("server").palette().color(WINDOW).name() == DARK  # the open panes follow
        _save_theme(qtbot, window, "light")
        assert window.palette().color(WINDOW).name() == app_look.style().standardPalette().color(WINDOW).name()
    finally:
        stop()
    window.context.settings.set("appearance.theme", "dark")  # no longer followed: nothing changes
    assert window.palette().color(WINDOW).name() != DARK
