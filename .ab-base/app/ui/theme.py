"""Colours of the window: Fusion with a light or dark palette, and the few styled roles the panes use.

Widgets opt in by object name (`errorText`, `hintText`, `verdict`...) or a dynamic
property, so no pane hard-codes a colour. `follow_theme` applies the setting live: a choice
saved in Settings (or the desktop's own light/dark switch, under "system") recolours the
open window at once, no restart.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from app.studio.settings import Settings

THEME_KEY = "appearance.theme"

STYLESHEET = """
QLabel#errorText, QLabel[error="true"] { color: #d32f2f; }
QLabel#hintText { color: #b07a00; }
QLabel#mutedText { color: palette(mid); }
QLabel#statusField { padding: 0 6px; }
QLabel#verdict { padding: 3px 10px; border-radius: 4px; font-weight: bold; color: white; background: #757575; }
QLabel#verdict[verdict="fits"] { background: #2e7d32; }
QLabel#verdict[verdict="tight"] { background: #ef8f00; }
QLabel#verdict[verdict="won't fit"] { background: #c62828; }
QListWidget#navigation { font-size: 14px; border: none; padding-top: 6px; }
QListWidget#navigation::item { padding: 10px 14px; }
QPlainTextEdit#snippet, QPlainTextEdit#requestLog { font-family: monospace; }
"""


def dark_palette() -> QPalette:
    palette = QPalette()
    colours = {
        QPalette.ColorRole.Window: "#2b2b2b", QPalette.ColorRole.WindowText: "#e6e6e6",
        QPalette.ColorRole.Base: "#1f1f1f", QPalette.ColorRole.AlternateBase: "#2f2f2f",
        QPalette.ColorRole.Text: "#e6e6e6", QPalette.ColorRole.Button: "#353535",
        QPalette.ColorRole.ButtonText: "#e6e6e6", QPalette.ColorRole.Highlight: "#3d7bd9",
        QPalette.ColorRole.HighlightedText: "#ffffff", QPalette.ColorRole.ToolTipBase: "#353535",
        QPalette.ColorRole.ToolTipText: "#e6e6e6", QPalette.ColorRole.PlaceholderText: "#8c8c8c",
        QPalette.ColorRole.Link: "#6aa5ff", QPalette.ColorRole.Mid: "#8c8c8c",
    }
    for role, colour in colours.items():
        palette.setColor(role, QColor(colour))
    palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor("#7a7a7a"))
    palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor("#7a7a7a"))
    return palette


def wants_dark(choice: str) -> bool:
    if choice == "system":
        return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark
    return choice == "dark"


def apply_theme(app: QApplication, choice: str) -> None:
    """`choice` is the appearance.theme setting: system, light or dark."""
    app.setStyle("Fusion")
    app.setPalette(dark_palette() if wants_dark(choice) else app.style().standardPalette())
    app.setStyleSheet(STYLESHEET)


def follow_theme(app: QApplication, settings: Settings) -> Callable[[], None]:
    """Apply the theme setting now and again whenever it (or the desktop's scheme, for "system") changes.

    Returns a function that stops following.
    """
    apply_theme(app, settings.get(THEME_KEY))

    def on_setting(key: str, value: object) -> None:
        if key == THEME_KEY:
            apply_theme(app, str(value))

    def on_scheme(_scheme: object) -> None:
        if settings.get(THEME_KEY) == "system":
            apply_theme(app, "system")

    unsubscribe = settings.subscribe(on_setting)
    hints = QGuiApplication.styleHints()
    hints.colorSchemeChanged.connect(on_scheme)

    def stop() -> None:
        unsubscribe()
        hints.colorSchemeChanged.disconnect(on_scheme)

    return stop
