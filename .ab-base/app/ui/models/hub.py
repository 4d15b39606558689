"""Hugging Face hub tables: search results, and a repo's files with their sizes and what is already on disk."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt

from app.engine.plan.fit import format_bytes
from app.studio.downloads import RemoteFile, SearchHit

Index = QModelIndex | QPersistentModelIndex
Row = TypeVar("Row")


class RowsTableModel(QAbstractTableModel, Generic[Row]):
    """A read-only table over a list of rows, its columns declared as (title, row -> text)."""

    def __init__(self, columns: Sequence[tuple[str, Callable[[Row], str]]]) -> None:
        super().__init__()
        self._columns = tuple(columns)
        self._rows: list[Row] = []

    def replace(self, rows: Sequence[Row]) -> None:
        self.beginResetModel()
        self._rows = list(rows)
        self.endResetModel()

    def row(self, index: int) -> Row | None:
        return self._rows[index] if 0 <= index < len(self._rows) else None

    def rows(self) -> list[Row]:
        return list(self._rows)

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._columns)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self._columns[section][0]
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if index.isValid() and role == Qt.ItemDataRole.DisplayRole:
            return self._columns[index.column()][1](self._rows[index.row()])
        return None


def search_results_model() -> RowsTableModel[SearchHit]:
    return RowsTableModel([
        ("Repository", lambda h: h.repo_id),
        ("Downloads", lambda h: f"{h.downloads:,}"),
        ("Likes", lambda h: f"{h.likes:,}"),
        ("GGUF", lambda h: "yes" if h.has_gguf else ""),
    ])


def remote_files_model(on_disk: Callable[[RemoteFile], int]) -> RowsTableModel[RemoteFile]:
    """`on_disk(file)`: bytes of it already downloaded (a finished file, or a paused part)."""

    def present(file: RemoteFile) -> str:
        have = on_disk(file)
        if have >= file.size and file.size:
            return "downloaded"
        return f"{format_bytes(have)} (paused)" if have else ""

    return RowsTableModel([
        ("File", lambda f: f.path),
        ("Size", lambda f: format_bytes(f.size)),
        ("On disk", present),
    ])
