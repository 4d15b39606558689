"""The Compare pane: one prompt to 2-4 targets at once, streaming side by side, timed per column, savable.

The work is `app.studio.compare.run_compare`, a coroutine on the qasync loop: each
column's deltas and final numbers arrive through its `on_event` on the Qt thread. One
column failing (a wrong key, an unreachable URL, a server error) shows its sentence in
that column while the others keep streaming.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.studio.compare import (
    MAX_TARGETS,
    MIN_TARGETS,
    ColumnResult,
    CompareRequest,
    CompareResult,
    list_models,
    run_compare,
)
from app.studio.compare_store import CompareSetup, load_setup, save_setup
from app.studio.secrets import OPENROUTER_API_KEY, SecretStore
from app.studio.settings import Settings
from app.studio.tasks import CancelToken, TaskResult
from app.ui.context import RuntimeWatcher
from app.ui.widgets.compare_column import CompareColumn
from app.ui.widgets.dialogs import Dialogs
from app.ui.widgets.wheel_guard import guard_wheel
from app.ui.workers import Worker

if TYPE_CHECKING:
    from app.engine import EngineClient

DEFAULT_COLUMNS = (("local", "", ""), ("openrouter", "meta-llama/llama-3.1-8b-instruct", ""))


class ComparePane(QWidget):
    compare_finished = Signal(object)  # TaskResult[CompareResult]

    def __init__(self, local_client: Callable[[], EngineClient | None], secrets: SecretStore, settings: Settings,
                 worker: Worker, dialogs: Dialogs, parent: QWidget | None = None, *,
                 state_file: Path | None = None, runtime: RuntimeWatcher | None = None,
                 copy_text: Callable[[str], None] | None = None) -> None:
        super().__init__(parent)
        self._local, self.secrets, self.settings, self.worker, self.dialogs = (
            local_client, secrets, settings, worker, dialogs)
        self._state_file, self._copy = state_file, copy_text
        self.columns: list[CompareColumn] = []
        self.result: CompareResult | None = None
        self._token: CancelToken | None = None
        self._build()
        self._restore()
        if runtime is not None:
            runtime.status_changed.connect(lambda status: self._show_local_model())
        self._update_buttons()

    def _build(self) -> None:
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("The prompt every column gets…")
        self.prompt.setMaximumHeight(70)
        self.system_prompt = QLineEdit()
        self.system_prompt.setPlaceholderText("optional")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 1_000_000)
        self.max_tokens.setValue(256)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setValue(0.7)
        self.openrouter_key = QLineEdit()
        self.openrouter_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.save_key_button = QPushButton("Save key")
        self.key_note = QLabel()
        self.key_note.setObjectName("hintText")
        self.key_note.setWordWrap(True)
        self._show_key_state()

        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.add_button = QPushButton("Add column")
        self.save_button = QPushButton("Save results…")
        self.raw_view = QCheckBox("Raw")
        self.raw_view.setToolTip("Show answers as the models wrote them, Markdown unrendered")
        self.notice = QLabel()
        self.notice.setWordWrap(True)

        key_line = QHBoxLayout()
        key_line.addWidget(self.openrouter_key, 1)
        key_line.addWidget(self.save_key_button)
        key_row = QVBoxLayout()
        key_row.addLayout(key_line)
        key_row.addWidget(self.key_note)
        options = QFormLayout()
        options.addRow("Prompt", self.prompt)
        options.addRow("System prompt", self.system_prompt)
        numbers = QHBoxLayout()
        numbers.addWidget(QLabel("Max tokens"))
        numbers.addWidget(self.max_tokens)
        numbers.addWidget(QLabel("Temperature"))
        numbers.addWidget(self.temperature)
        numbers.addStretch(1)
        options.addRow("", numbers)
        options.addRow("OpenRouter key", key_row)
        buttons = QHBoxLayout()
        for button in (self.add_button, self.save_button, self.raw_view):
            buttons.addWidget(button)
        buttons.addWidget(self.notice, 1)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.run_button)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        layout = QVBoxLayout(self)
        layout.addLayout(options)
        layout.addLayout(buttons)
        layout.addWidget(self.splitter, 1)

        self.run_button.clicked.connect(self.run)
        self.stop_button.clicked.connect(self.stop)
        self.add_button.clicked.connect(lambda: self.add_column("openai"))
        self.save_button.clicked.connect(self.save)
        self.save_key_button.clicked.connect(self.save_key)
        self.raw_view.toggled.connect(lambda raw: [column.set_raw(raw) for column in self.columns])

    # -- columns ----------------------------------------------------------------------------
    def add_column(self, kind: str = "openai", model: str = "", base_url: str = "") -> CompareColumn | None:
        if len(self.columns) >= MAX_TARGETS:
            return None
        column = CompareColumn(kind, model, base_url, copy_text=self._copy)
        column.remove_requested.connect(self.remove_column)
        column.models_requested.connect(self.list_models)
        column.set_raw(self.raw_view.isChecked())
        self.columns.append(column)
        self.splitter.addWidget(column)
        guard_wheel(column)
        self._show_local_model()
        self._update_buttons()
        return column

    def remove_column(self, column: CompareColumn) -> None:
        if len(self.columns) <= MIN_TARGETS or self.running:
            return
        self.columns.remove(column)
        column.setParent(None)
        column.deleteLater()
        self._update_buttons()

    def list_models(self, column: CompareColumn) -> None:
        """Fill the column's model list from its endpoint's /v1/models (on the worker: it is a request)."""
        url, key = column.base_url.text().strip(), column.api_key.text().strip() or None
        if not url:
            column.show_error("Enter the endpoint's base URL first.")
            return
        column.show_error(None)
        self.worker.submit(lambda ctx: list_models(url, key), owner=self,
                           on_done=lambda result: column.set_model_choices(result.value or []) if result.ok
                           else column.show_error(result.error_message))

    def _show_local_model(self) -> None:
        client = self._local()
        for column in self.columns:
            column.set_local_model(client.model.name if client is not None else "")

    # -- kept across restarts -------------------------------------------------------------------
    def _restore(self) -> None:
        setup = load_setup(self._state_file) if self._state_file is not None else None
        if setup is None or not MIN_TARGETS <= len(setup.columns) <= MAX_TARGETS:
            for kind, model, url in DEFAULT_COLUMNS:
                self.add_column(kind, model, url)
            return
        for saved in setup.columns:
            self.add_column(saved["kind"], saved["model"], saved["base_url"])
        self.prompt.setPlainText(setup.prompt)
        self.system_prompt.setText(setup.system_prompt)
        self.max_tokens.setValue(setup.max_tokens)
        self.temperature.setValue(setup.temperature)
        self.result = setup.result
        if setup.result is not None and len(setup.result.columns) == len(self.columns):
            for column, saved_result in zip(self.columns, setup.result.columns, strict=True):
                column.show_result(saved_result, "")
            self._notify(f"The last comparison ({setup.result.started_at}).")

    def keep(self) -> None:
        """Save the columns, options and last results (when the pane has a state file)."""
        if self._state_file is None:
            return
        setup = CompareSetup([c.setup() for c in self.columns], self.prompt.toPlainText(),
                             self.system_prompt.text(), self.max_tokens.value(), self.temperature.value(),
                             self.result)
        try:
            save_setup(self._state_file, setup)
        except OSError as exc:
            self._notify(f"The Compare setup could not be kept: {exc}", error=True)

    # -- running ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._token is not None

    def run(self) -> None:
        if self.running:
            return
        prompt = self.prompt.toPlainText().strip()
        if not prompt:
            self._notify("Type a prompt first.", error=True)
            return
        key = self.secrets.get(OPENROUTER_API_KEY)
        base = self.settings.get("compare.openrouter_base_url")
        targets, local = [], self._local()
        for column in self.columns:
            column.reset()
            try:
                targets.append(column.target(local, key, base))
            except ValueError as exc:
                column.show_error(str(exc))
        if len(targets) < len(self.columns):
            self._notify("Fix the columns marked in red, then run again.", error=True)
            return
        request = CompareRequest(prompt, self.system_prompt.text().strip(), self.max_tokens.value(),
                                 self.temperature.value())
        self._token = CancelToken()
        self.result = None
        self._notify("Running…")
        self.worker.spawn(run_compare(request, targets, on_event=self._on_event, token=self._token,
                                      timeout_s=self.settings.get("compare.timeout_s")),
                          on_done=self._on_done, owner=self)
        self._update_buttons()

    def stop(self) -> None:
        if self._token is not None:
            self._token.cancel()

    def shutdown(self) -> None:
        self.stop()
        self.keep()

    def _on_event(self, index: int, column: ColumnResult, new_text: str) -> None:
        if index < len(self.columns):
            self.columns[index].show_result(column, new_text)

    def _on_done(self, outcome: TaskResult[CompareResult]) -> None:
        self._token = None
        if outcome.ok:
            self.result = outcome.value
            failed = sum(1 for c in self.result.columns if c.error)
            self._notify(f"Done; {failed} column{'s' if failed != 1 else ''} failed." if failed else "Done.")
        else:
            self._notify(outcome.error_message or "The comparison did not run.", error=not outcome.cancelled)
        self._update_buttons()
        self.keep()
        self.compare_finished.emit(outcome)

    # -- results and keys ----------------------------------------------------------------------
    def save(self) -> None:
        if self.result is None:
            return
        path = self.dialogs.save_path(self, "Save comparison", "comparison.md", "Markdown (*.md);;JSON (*.json)")
        if not path:
            return
        try:
            saved = self.result.save(path)
        except (ValueError, OSError) as exc:
            self._notify(f"Could not save: {exc}", error=True)
            return
        self._notify(f"Saved to {saved}")

    def save_key(self) -> None:
        try:
            self.secrets.set(OPENROUTER_API_KEY, self.openrouter_key.text())
        except Exception as exc:  # a keyring backend's own failure, shown as a sentence
            self._notify(f"Could not store the key: {exc}", error=True)
            return
        self.openrouter_key.clear()
        self._show_key_state()

    def _show_key_state(self) -> None:
        stored = self.secrets.get(OPENROUTER_API_KEY) is not None
        self.openrouter_key.setPlaceholderText("a key is stored (type to replace it)" if stored else "sk-or-…")
        notes = [] if stored else ["OpenRouter columns need a key from openrouter.ai/keys."]
        if self.secrets.warning:
            notes.append(self.secrets.warning)
        self.key_note.setText(" ".join(notes))
        self.key_note.setVisible(bool(notes))

    def _notify(self, text: str, error: bool = False) -> None:
        self.notice.setText(text)
        self.notice.setObjectName("errorText" if error else "")
        self.notice.style().unpolish(self.notice)
        self.notice.style().polish(self.notice)

    def _update_buttons(self) -> None:
        running = self.running
        self.run_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        self.add_button.setEnabled(not running and len(self.columns) < MAX_TARGETS)
        self.save_button.setEnabled(not running and self.result is not None)
        for column in self.columns:
            column.remove.setEnabled(not running and len(self.columns) > MIN_TARGETS)
