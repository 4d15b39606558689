"""Read-only text with a Copy button: base URLs on one line, snippets on several."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QHBoxLayout, QLineEdit, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget


class CopyLine(QWidget):
    def __init__(self, copy_text: Callable[[str], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.text = QLineEdit()
        self.text.setReadOnly(True)
        self.copy_button = QPushButton("Copy")
        self.copy_button.clicked.connect(lambda: copy_text(self.text.text()))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.copy_button)

    def set_text(self, text: str) -> None:
        self.text.setText(text)
        self.copy_button.setEnabled(bool(text))


class CopyBlock(QWidget):
    def __init__(self, copy_text: Callable[[str], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.text = QPlainTextEdit()
        self.text.setObjectName("snippet")
        self.text.setReadOnly(True)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.copy_button = QPushButton("Copy")
        self.copy_button.clicked.connect(lambda: copy_text(self.text.toPlainText()))
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.copy_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.text, 1)
        layout.addLayout(row)

    def set_text(self, text: str) -> None:
        self.text.setPlainText(text)
