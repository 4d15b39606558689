"""One column of the Compare pane: which target it asks, and what came back (text, timings, or the error)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QStringListModel, Signal
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (
    QComboBox,
    QCompleter,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.studio.compare import ColumnResult, Target, with_v1
from app.ui.widgets.feedback import error_label, show_error
from app.ui.widgets.markdown_view import MarkdownView

if TYPE_CHECKING:
    from app.engine import EngineClient

KINDS = (("local", "Local model"), ("openrouter", "OpenRouter"), ("openai", "OpenAI-compatible URL"))
STATUS_TEXT = {"waiting": "waiting…", "streaming": "streaming…", "done": "done", "error": "failed",
               "cancelled": "stopped"}


class CompareColumn(QFrame):
    remove_requested = Signal(object)  # this column
    models_requested = Signal(object)  # this column: fill its model list from the endpoint's /v1/models

    def __init__(self, kind: str = "local", model: str = "", base_url: str = "",
                 parent: QWidget | None = None, copy_text: Callable[[str], None] | None = None) -> None:
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
        self.list_models = QToolButton()
        self.list_models.setText("List")
        self.list_models.setToolTip("Fill the model list from the endpoint's /v1/models")
        self.list_models.clicked.connect(lambda: self.models_requested.emit(self))
        self.url_note = QLabel()
        self.url_note.setObjectName("hintText")
        self.url_note.hide()
        self.base_url.editingFinished.connect(self._complete_url)
        self.output = MarkdownView(copy_text)
        self.raw = False
        self._text = ""  # the answer as streamed (the view may show it rendered)
        self._local_name = ""
        self.stats = QLabel()
        self.stats.setWordWrap(True)
        self.error = error_label(hidden=True)

        header = QHBoxLayout()
        header.addWidget(self.kind, 1)
        header.addWidget(self.remove)
        self.form = QFormLayout()
        model_row = QHBoxLayout()
        model_row.addWidget(self.model, 1)
        model_row.addWidget(self.list_models)
        self.form.addRow("Model", model_row)
        self.form.addRow("Base URL", self.base_url)
        self.form.addRow("", self.url_note)
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
        self._complete_url()
        url = self.base_url.text().strip()
        if not url.startswith(("http://", "https://")):
            raise ValueError("Enter the endpoint's base URL, starting with http:// or https://.")
        return Target.openai_compatible(url, model, self.api_key.text().strip() or None)

    def setup(self) -> dict[str, str]:
        """What restores this column after a restart (no API key: those are not written to files)."""
        model = "" if self.kind_key == "local" else self.model.text().strip()
        return {"kind": self.kind_key, "model": model, "base_url": self.base_url.text().strip()}

    def set_local_model(self, name: str) -> None:
        """The loaded model's name, shown in a local column."""
        self._local_name = name
        if self.kind_key == "local":
            self.model.setText(name)

    def set_model_choices(self, ids: list[str]) -> None:
        completer = QCompleter(QStringListModel(ids, self), self.model)
        completer.setCaseSensitivity(completer.caseSensitivity().CaseInsensitive)
        completer.setCompletionMode(QCompleter.CompletionMode.UnfilteredPopupCompletion)
        self.model.setCompleter(completer)
        if ids and self.model.text().strip() not in ids:
            self.model.setText(ids[0])
        self.url_note.setText(f"{len(ids)} model{'s' if len(ids) != 1 else ''} served here: pick one in the list.")
        self.url_note.show()
        if ids:
            completer.complete()

    def model_choices(self) -> list[str]:
        completer = self.model.completer()
        return completer.model().stringList() if completer is not None else []

    def set_raw(self, raw: bool) -> None:
        self.raw = raw
        self._render()

    def reset(self) -> None:
        self._text = ""
        self.output.clear()
        self.stats.setText("")
        self.show_error(None)

    def show_error(self, text: str | None) -> None:
        show_error(self.error, text)

    def show_result(self, column: ColumnResult, new_text: str) -> None:
        if new_text:
            self._text += new_text
            cursor = self.output.textCursor()
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(new_text)
            self.output.setTextCursor(cursor)
        if column.status != "streaming" and column.status != "waiting":
            self._text = column.text or self._text
            self._render()  # the whole answer is in: render it
        self.show_error(column.error)
        self.stats.setText(describe(column))

    def _render(self) -> None:
        self.output.show_markdown(self._text, raw=self.raw)

    def _complete_url(self) -> None:
        url = self.base_url.text().strip()
        if url and with_v1(url) != url:
            self.base_url.setText(with_v1(url))
            self.url_note.setText("/v1 added: OpenAI-compatible servers serve the API there.")
            self.url_note.show()

    def _on_kind(self) -> None:
        kind = self.kind_key
        local = kind == "local"
        self.model.setReadOnly(local)
        if local:
            self.model.setText(self._local_name)
        self.list_models.setVisible(kind == "openai")
        self.model.setPlaceholderText("the loaded model" if local else
                                      "e.g. meta-llama/llama-3.1-8b-instruct" if kind == "openrouter" else "model id")
        self.form.setRowVisible(self.base_url, kind == "openai")
        self.form.setRowVisible(self.api_key, kind == "openai")


def describe(column: ColumnResult) -> str:
    """'done · TTFT 0.41 s · 31.2 tok/s · 7 prompt + 35 tokens'"""
    parts = [STATUS_TEXT.get(column.status, column.status)]
    if column.ttft_s is not None:
        parts.append(f"TTFT {column.ttft_s:.2f} s")
    speed = column.tokens_per_s if column.tokens_per_s is not None else (
        column.live_speed() if column.status == "streaming" else None)
    if speed is not None:
        parts.append(f"{speed:.1f} tok/s")
    if column.completion_tokens is not None:
        estimated = " (est.)" if column.tokens_estimated else ""
        prompt = f"{column.prompt_tokens} prompt + " if column.prompt_tokens is not None else ""
        parts.append(f"{prompt}{column.completion_tokens} tokens{estimated}")
    return " · ".join(parts)
