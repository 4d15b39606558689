"""The local models table: one row per model in the folder (and the embedded default), with its metadata."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QFont

from app.engine.plan.fit import format_bytes
from app.studio.library import ModelEntry
from app.studio.model_check import INCOMPLETE_HINT

Index = QModelIndex | QPersistentModelIndex


def count(n: int | None) -> str:
    """1.2B, 268.1M: parameter counts as people say them."""
    if n is None:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


COLUMNS: tuple[tuple[str, Callable[[ModelEntry], str]], ...] = (
    ("Name", lambda e: e.name),
    ("Format", lambda e: e.format.upper()),
    ("Architecture", lambda e: e.architecture or "?"),
    ("Does", lambda e: e.job or "?"),  # what it is for, read from its files (plan/job.py)
    ("Parameters", lambda e: count(e.parameters)),
    ("Quantization", lambda e: e.quantization or "?"),
    ("Context", lambda e: f"{e.context_length:,}" if e.context_length else "?"),
    ("Size", lambda e: format_bytes(e.size_bytes)),
)
NOTES_COLUMN = len(COLUMNS)  # "loaded", "base", "incomplete download…": depends on what is loaded too
HEADERS = (*(title for title, _ in COLUMNS), "Notes")


def notes(entry: ModelEntry, loaded: bool) -> str:
    """The badges of a row, most important first."""
    marks = []
    if entry.incomplete:
        marks.append(INCOMPLETE_HINT)
    elif entry.error and entry.architecture is None:
        marks.append("unreadable")
    elif entry.error:
        marks.append("problem: see details")
    if loaded:
        marks.append("loaded")
    if entry.is_base:
        marks.append("base")
    if entry.job_note:
        marks.append(entry.job_note[0])
    elif entry.takes_images:
        marks.append("takes images")
    if entry.job == "transcription":
        marks.append("transcription")
    return " · ".join(marks)


class LibraryTableModel(QAbstractTableModel):
    def __init__(self) -> None:
        super().__init__()
        self._entries: list[ModelEntry] = []
        self._loaded_path: str = ""

    def replace(self, entries: list[ModelEntry]) -> None:
        self.beginResetModel()
        self._entries = list(entries)
        self.endResetModel()

    def set_loaded(self, path: str) -> None:
        """Show the model at `path` in bold (the one the engine has loaded)."""
        self._loaded_path = path
        if self._entries:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self._entries) - 1, len(HEADERS) - 1))

    def entry(self, row: int) -> ModelEntry | None:
        return self._entries[row] if 0 <= row < len(self._entries) else None

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self._entries)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(HEADERS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return HEADERS[section]
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        entry = self._entries[index.row()]
        loaded = bool(self._loaded_path) and str(entry.path) == self._loaded_path
        if role == Qt.ItemDataRole.DisplayRole:
            return notes(entry, loaded) if index.column() == NOTES_COLUMN else COLUMNS[index.column()][1](entry)
        if role == Qt.ItemDataRole.ToolTipRole:
            if index.column() == NOTES_COLUMN and entry.is_base:
                return ("A base model: it continues text rather than answering. For chat, pick an instruct "
                        "model (Models → Download, 'Recommended').")
            return entry.error or str(entry.path)
        if role == Qt.ItemDataRole.FontRole and loaded:
            font = QFont()
            font.setBold(True)
            return font
        if role == Qt.ItemDataRole.ForegroundRole and entry.error:
            from PySide6.QtGui import QColor

            return QColor("#c62828")
        return None
