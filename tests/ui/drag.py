"""Drag and drop as a window system delivers it, for the pane tests."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QWidget


def drop(widget: QWidget, paths: list[Path]) -> None:
    """What a window system delivers when files are dragged onto `widget` and released (onto
    the viewport of a scroll area, as a real drop lands)."""
    if isinstance(widget, QAbstractScrollArea):
        widget = widget.viewport()
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path)) for path in paths])
    point = QPointF(widget.rect().center())
    buttons, modifiers = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    enter = QDragEnterEvent(point, Qt.DropAction.CopyAction, mime, buttons, modifiers)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted(), "the widget refused the drag"
    release = QDropEvent(point, Qt.DropAction.CopyAction, mime, buttons, modifiers)
    QApplication.sendEvent(widget, release)
    assert release.isAccepted(), "the widget refused the drop"
