"""The model picker in the chat's header: the library's models, the loaded one shown; choosing one loads it.

Loading goes through `model_choice.load_entry`, the Models pane's own path: EngineHost's
transactional switch, which checks the new files before unloading anything and keeps the
old model loaded when the new one fails. The picker then shows the model that is really
loaded again (a failed choice never stays selected), and the chat shows why it failed. As in the
Models pane, will-it-fit is asked first (on the worker) and a model predicted not to fit loads only
when the user answers "load anyway?" with yes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QComboBox, QWidget

from app.studio.library import ModelEntry, ModelLibrary
from app.studio.model_choice import LOAD_ANYWAY, fit_of, list_models, load_entry, wont_fit_question
from app.studio.runtime import EngineHost, RuntimeStatus
from app.studio.settings import Settings
from app.studio.tasks import TaskResult
from app.ui.context import RuntimeWatcher
from app.ui.widgets.dialogs import Dialogs
from app.ui.workers import Worker

if TYPE_CHECKING:
    from app.engine.plan.fit import FitReport

NONE_LOADED = "No model loaded: choose one"


class ModelPicker(QComboBox):
    refused = Signal(str)  # a choice that could not even start loading (a bad setting), in words
    fit_checked = Signal(object)  # TaskResult[FitReport | None]: will-it-fit of the model just chosen

    def __init__(self, library: Callable[[], ModelLibrary], host: EngineHost, settings: Settings,
                 runtime: RuntimeWatcher, worker: Worker, dialogs: Dialogs, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._library, self.host, self.settings, self.runtime, self.worker = library, host, settings, runtime, worker
        self.dialogs = dialogs
        self.entries: list[ModelEntry] = []
        self._choice = 0  # counts choices: a fit verdict for an older one is ignored
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(24)  # long file names elide instead of widening the window
        self.setToolTip("The model answering in this chat: choose another to load it")
        self.activated.connect(self._on_chosen)  # the user's choices only, not ours
        runtime.status_changed.connect(self._on_runtime)
        self.refresh()

    def refresh(self) -> None:
        """List the models again (on the worker: the embedded one is assembled on first use)."""
        library = self._library()
        self.worker.submit(lambda ctx: list_models(library), on_done=self._on_listed, owner=self)

    def showEvent(self, event: QShowEvent) -> None:
        """Listed again each time the chat comes into view: a model downloaded meanwhile is offered."""
        super().showEvent(event)
        self.refresh()

    def _on_listed(self, result: TaskResult[list[ModelEntry]]) -> None:
        self.entries = [entry for entry in result.value or [] if entry.usable]
        self._show_loaded()

    def _show_loaded(self) -> None:
        status = self.runtime.status
        self.blockSignals(True)
        self.clear()
        loaded = -1
        for row, entry in enumerate(self.entries):
            self.addItem(f"{entry.name} (base)" if entry.is_base else entry.name)
            self.setItemData(row, str(entry.path), Qt.ItemDataRole.ToolTipRole)  # tooltip: where the file is
            if status.ready and str(entry.path) == status.path:
                loaded = row
        if loaded < 0:  # nothing loaded, or a model that is not in the library (adopted, found by path)
            self.insertItem(0, status.model if status.ready else NONE_LOADED)
            loaded = 0
        self.setCurrentIndex(loaded)
        self.blockSignals(False)
        self.setEnabled(not status.busy and bool(self.entries))

    def _entry_at(self, index: int) -> ModelEntry | None:
        offset = self.count() - len(self.entries)  # the placeholder row, when there is one
        row = index - offset
        return self.entries[row] if 0 <= row < len(self.entries) else None

    def _on_chosen(self, index: int) -> None:
        entry, status = self._entry_at(index), self.runtime.status
        if entry is None or status.busy or (status.ready and str(entry.path) == status.path):
            self._show_loaded()
            return
        self._choice += 1
        choice, settings = self._choice, self.settings
        self.setEnabled(False)  # until the verdict is in: one choice at a time
        self.worker.submit(lambda ctx: fit_of(entry, settings),
                           on_done=lambda result: self._on_fit(result, entry, choice), owner=self)

    def _on_fit(self, result: TaskResult[FitReport | None], entry: ModelEntry, choice: int) -> None:
        """Load the chosen model, asking first when it is predicted not to fit (a failed check asks nothing:
        the Models pane loads a model whose fit is unknown, too)."""
        self.fit_checked.emit(result)
        if choice != self._choice or self.runtime.status.busy:
            self._show_loaded()
            return
        question = wont_fit_question(entry, result.value)
        if question is not None and not self.dialogs.confirm(self, LOAD_ANYWAY, question):
            self._show_loaded()  # the loaded model is shown again, nothing changed
            return
        try:
            load_entry(self.host, self.settings, entry)
        except ValueError as exc:
            self._show_loaded()
            self.refused.emit(f"Cannot load {entry.name}: {exc}")

    def _on_runtime(self, status: RuntimeStatus) -> None:
        if status.ready and not any(str(e.path) == status.path for e in self.entries) and status.path:
            self.refresh()  # a model just downloaded and loaded from the Models pane: list it
        self._show_loaded()
