"""Dropping files on the Studio: a visible drop target with an Open… button, and a filter for any widget.

Both hand over local file paths only (URLs from a browser are not files) and leave the
judging to the pane: a wrong kind of file is still taken, so the pane can say why it
cannot use it instead of the cursor silently refusing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEvent, QMimeData, QObject, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QWidget,
)

# (parent, title, name filters, several files?) -> the chosen paths; tests replace it
FileChooser = Callable[[QWidget, str, str, bool], list[str]]

STYLE = """
QFrame#dropZone { border: 2px dashed palette(mid); border-radius: 6px; }
QFrame#dropZone[dragging="true"] { border-color: palette(highlight); background: palette(alternate-base); }
"""


def dropped_files(mime: QMimeData) -> list[Path]:
    """The local files a drag carries (none for text, images or remote URLs)."""
    if not mime.hasUrls():
        return []
    return [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile() and url.toLocalFile()]


def choose_files(parent: QWidget, title: str, filters: str, multiple: bool) -> list[str]:
    if multiple:
        paths, _ = QFileDialog.getOpenFileNames(parent, title, "", filters)
        return list(paths)
    path, _ = QFileDialog.getOpenFileName(parent, title, "", filters)
    return [path] if path else []


class FileDropFilter(QObject):
    """Takes file drops on widgets that are not drop targets of their own (a transcript, a text box).

    Text boxes accept drops themselves (a dropped file would become its path typed in), so
    the filter sits in front of them: file drags are taken here, anything else passes.
    """

    files_dropped = Signal(list)  # list[Path]

    def watch(self, *widgets: QWidget) -> None:
        for widget in widgets:
            # a scroll area's drops arrive at its viewport, not at the area itself
            target = widget.viewport() if isinstance(widget, QAbstractScrollArea) else widget
            target.setAcceptDrops(True)
            target.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove, QEvent.Type.Drop):
            assert isinstance(event, QDragEnterEvent | QDragMoveEvent | QDropEvent)
            files = dropped_files(event.mimeData())
            if not files:
                return False
            event.acceptProposedAction()
            if kind == QEvent.Type.Drop:
                self.files_dropped.emit(files)
            return True
        return super().eventFilter(watched, event)


class DropZone(QFrame):
    """A dashed box saying what to drop, with an Open… button for those who would rather browse."""

    files_dropped = Signal(list)  # list[Path], from a drop or the file dialog

    def __init__(self, text: str, filters: str, multiple: bool = True, chooser: FileChooser = choose_files,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("dropZone")
        self.setStyleSheet(STYLE)
        self.setAcceptDrops(True)
        self.filters, self.multiple, self.chooser = filters, multiple, chooser
        self.label = QLabel(text)
        self.label.setWordWrap(True)
        self.open_button = QPushButton("Open…")
        self.open_button.clicked.connect(self.open_files)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(14, 12, 14, 12)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.open_button)

    def open_files(self) -> None:
        title = "Open files" if self.multiple else "Open a file"
        paths = [Path(path) for path in self.chooser(self, title, self.filters, self.multiple) if path]
        if paths:
            self.files_dropped.emit(paths)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if dropped_files(event.mimeData()):
            event.acceptProposedAction()
            self._show_dragging(True)

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:
        if dropped_files(event.mimeData()):
            event.acceptProposedAction()

    def dragLeaveEvent(self, event: QEvent) -> None:
        self._show_dragging(False)

    def dropEvent(self, event: QDropEvent) -> None:
        self._show_dragging(False)
        files = dropped_files(event.mimeData())
        if files:
            event.setDropAction(Qt.DropAction.CopyAction)
            event.accept()
            self.files_dropped.emit(files)

    def _show_dragging(self, dragging: bool) -> None:
        self.setProperty("dragging", dragging)
        self.style().unpolish(self)  # re-evaluate the [dragging="true"] rule
        self.style().polish(self)
