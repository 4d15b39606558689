"""Modal questions the panes ask (confirm a delete, where to save), behind one object tests can replace."""

from __future__ import annotations

from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget


class Dialogs:
    """The real dialogs. Tests pass a subclass that answers without showing anything."""

    def confirm(self, parent: QWidget, title: str, text: str) -> bool:
        answer = QMessageBox.question(parent, title, text,
                                      QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                                      QMessageBox.StandardButton.No)
        return answer == QMessageBox.StandardButton.Yes

    def save_path(self, parent: QWidget, title: str, suggested: str, filters: str) -> str | None:
        path, _ = QFileDialog.getSaveFileName(parent, title, suggested, filters)
        return path or None
