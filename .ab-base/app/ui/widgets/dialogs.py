"""Modal questions the panes ask (confirm a delete, where to save), behind one object tests can replace."""

from __future__ import annotations

from PySide6.QtWidgets import QFileDialog, QInputDialog, QLineEdit, QMessageBox, QWidget


class Dialogs:
    """The real dialogs. Tests pass a subclass that answers without showing anything."""

    def confirm(self, parent: QWidget, title: str, text: str) -> bool:
        answer = QMessageBox.question(parent, title, text,
                                      QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                                      QMessageBox.StandardButton.No)
        return answer == QMessageBox.StandardButton.Yes

    def choose(self, parent: QWidget, title: str, text: str, choices: list[str]) -> str | None:
        """One of `choices` (button labels, the first is the default), or None when the box is closed."""
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.NoButton, parent)
        buttons = {box.addButton(label, QMessageBox.ButtonRole.ActionRole): label for label in choices}
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(next(iter(buttons)))
        box.exec()
        return buttons.get(box.clickedButton())

    def ask_text(self, parent: QWidget, title: str, label: str, text: str) -> str | None:
        """A line of text typed by the user, or None when cancelled."""
        value, ok = QInputDialog.getText(parent, title, label, QLineEdit.EchoMode.Normal, text)
        return value if ok else None

    def save_path(self, parent: QWidget, title: str, suggested: str, filters: str) -> str | None:
        path, _ = QFileDialog.getSaveFileName(parent, title, suggested, filters)
        return path or None

    def open_folder(self, parent: QWidget, title: str) -> str | None:
        """A folder chosen (a model's), or None when cancelled."""
        return QFileDialog.getExistingDirectory(parent, title) or None

    def open_paths(self, parent: QWidget, title: str, filters: str) -> list[str]:
        """Files chosen to open (none when cancelled)."""
        paths, _ = QFileDialog.getOpenFileNames(parent, title, "", filters)
        return list(paths)
