"""One column of the Compare pane: which target it asks, and what came back (text, timings, or the error)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Signal
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.studio.compare import ColumnResult, Target
from app.ui.widgets.feedback import error_label, show_error

if TYPE_CHECKING:
    from app.engine import EngineClient

KINDS = (("local", "Local model"), ("openrouter", "OpenRouter"), ("openai", "OpenAI-compatible URL"))
STATUS_TEXT = {"waiting": "waiting…", "streaming": "streaming…", "done": "done", "error": "failed",
               "cancelled": "stopped"}


class CompareColumn(QFrame):
    remove_requested = Signal(object)  # this column

    def __init__(self, kind: str = "local", model: str = "", base_url: str = "",
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.kind = QComboBox()
        for key, label in KINDS:
            self.kind.addItem(label, key)
        self.model = QLineEdit(model)
        self.base_url = QLineEdit(base_url)
        self.base_url.setPlaceholderText("http://localhost:8080/v1")
        self.api_key = QLineEdit()
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("optional")
        self.remove = QToolButton()
        self.remove.setText("✕")
        self.remove.setToolTip("Remove this column")
        self.remove.clicked.connect(lambda: self.remove_requested.emit(self))
        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        self.stats = QLabel()
        self.stats.setWordWrap(True)
        self.error = error_label(hidden=True)

        header = QHBoxLayout()
        header.addWidget(self.kind, 1)
        header.addWidget(self.remove)
        self.form = QFormLayout()
        self.form.addRow("Model", self.model)
        self.form.addRow("Base URL", self.base_url)
        self.form.addRow("API key", self.api_key)
        layout = QVBoxLayout(self)
        layout.addLayout(header)
        layout.addLayout(self.form)
        layout.addWidget(self.output, 1)
        layout.addWidget(self.error)
        layout.addWidget(self.stats)
        self.kind.currentIndexChanged.connect(self._on_kind)
        self.kind.setCurrentIndex(next(i for i, (key, _) in enumerate(KINDS) if key == kind))
        self._on_kind()

    @property
    def kind_key(self) -> str:
        return str(self.kind.currentData())

    def target(self, local: EngineClient | None, openrouter_key: str | None, openrouter_base: str) -> Target:
        """The target this column describes, or ValueError saying what is missing."""
        kind, model = self.kind_key, self.model.text().strip()
        if kind == "local":
            if local is None:
                raise ValueError("No local model is loaded: load one in the Models pane.")
            return Target.local(local)
        if not model:
            raise ValueError("Enter the model name this endpoint serves.")
        if kind == "openrouter":
            return Target.openrouter(model, openrouter_key, openrouter_base)
        url = self.base_url.text().strip()
        if not url.startswith(("http://", "https://")):
            raise ValueError("Enter the endpoint's base URL, starting with http:// or https://.")
        return Target.openai_compatible(url, model, self.api_key.text().strip() or None)

    def reset(self) -> None:
        self.output.clear()
        self.stats.setText("")
        self.show_error(None)

    def show_error(self, text: str | None) -> None:
        show_error(self.error, text)

    def show_result(self, column: ColumnResult, new_text: str) -> None:
        if new_text:
            cursor = self.output.textCursor()
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(new_text)
            self.output.setTextCursor(cursor)
        self.show_error(column.error)
        self.stats.setText(describe(column))

    def _on_kind(self) -> None:
        kind = self.kind_key
        local = kind == "local"
        self.model.setReadOnly(local)
        self.model.setPlaceholderText("the loaded model" if local else
                                      "e.g. meta-llama/llama-3.1-8b-instruct" if kind == "openrouter" else "model id")
        self.form.setRowVisible(self.base_url, kind == "openai")
        self.form.setRowVisible(self.api_key, kind == "openai")


def describe(column: ColumnResult) -> str:
    """'done · TTFT 0.41 s · 31.2 tok/s · 7 prompt + 35 tokens'"""
    parts = [STATUS_TEXT.get(column.status, column.status)]
    if column.ttft_s is not None:
        parts.append(f"TTFT {column.ttft_s:.2f} s")
    if column.tokens_per_s is not None:
        parts.append(f"{column.tokens_per_s:.1f} tok/s")
    if column.completion_tokens is not None:
        estimated = " (est.)" if column.tokens_estimated else ""
        prompt = f"{column.prompt_tokens} prompt + " if column.prompt_tokens is not None else ""
        parts.append(f"{prompt}{column.completion_tokens} tokens{estimated}")
    return " · ".join(parts)
