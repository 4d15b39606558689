"""The Models pane: the local models folder (visible path, metadata, fit, load/unload/delete) and the hub.

Listing the folder reads only file headers, but the embedded model is assembled from
its package on first use, so listing, fit checks and deleting run on the worker. The
fit verdict of the selected model is on screen before Load is pressed; loading one
that will not fit asks first.
"""

from __future__ import annotations

import html
from collections.abc import Callable

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.studio.downloads import HubClient
from app.studio.fit_estimate import FitEstimate, estimate
from app.studio.library import ModelEntry, ModelLibrary
from app.studio.model_choice import EMBEDDED_NAME, LOAD_ANYWAY, list_models, load_entry, wont_fit_question
from app.studio.runtime import EngineHost, RuntimeStatus, fit_options, task_models_beside
from app.studio.settings import Settings
from app.studio.tasks import TaskResult
from app.ui.context import RuntimeWatcher
from app.ui.models.library import LibraryTableModel, count
from app.ui.widgets.dialogs import Dialogs
from app.ui.widgets.fit_view import FitView
from app.ui.widgets.hub_browser import HubBrowser
from app.ui.widgets.tables import make_table
from app.ui.workers import Worker


class ModelsPane(QWidget):
    listed = Signal(object)  # TaskResult[list[ModelEntry]]
    fit_checked = Signal(object)  # TaskResult[FitEstimate]

    def __init__(self, library: Callable[[], ModelLibrary], hub: Callable[[], HubClient], host: EngineHost,
                 runtime: RuntimeWatcher, settings: Settings, worker: Worker, dialogs: Dialogs,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._library, self.host, self.runtime, self.settings, self.worker, self.dialogs = (
            library, host, runtime, settings, worker, dialogs)
        self.hub = HubBrowser(hub, lambda: self._library().root, settings, worker)
        self.entries = LibraryTableModel()
        self._embedded_path = ""
        self._fit_asked = 0
        self._build()
        self.hub.download_finished.connect(lambda result: self.refresh() if result.ok else None)
        runtime.status_changed.connect(self._on_runtime)
        self._on_runtime(runtime.status)
        self.refresh()

    def _build(self) -> None:
        self.folder = QLineEdit()
        self.folder.setReadOnly(True)
        self.open_folder = QPushButton("Open folder")
        self.refresh_button = QPushButton("Refresh")
        self.table = make_table(self.entries)
        self.details = QLabel("Select a model.")
        self.details.setWordWrap(True)
        self.fit = FitView()
        self.load_button = QPushButton("Load")
        self.unload_button = QPushButton("Unload")
        self.delete_button = QPushButton("Delete")
        self.notice = QLabel()
        self.notice.setWordWrap(True)

        folder_row = QHBoxLayout()
        folder_row.addWidget(QLabel("Models folder"))
        folder_row.addWidget(self.folder, 1)
        folder_row.addWidget(self.open_folder)
        folder_row.addWidget(self.refresh_button)
        actions = QHBoxLayout()
        actions.addStretch(1)
        for button in (self.delete_button, self.unload_button, self.load_button):
            actions.addWidget(button)
        side = QWidget()
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(0, 0, 0, 0)
        side_layout.addWidget(self.details)
        side_layout.addWidget(self.fit)
        side_layout.addStretch(1)
        side_layout.addWidget(self.notice)
        side_layout.addLayout(actions)
        splitter = QSplitter()
        splitter.addWidget(self.table)
        splitter.addWidget(side)
        splitter.setSizes([700, 420])
        local = QWidget()
        local_layout = QVBoxLayout(local)
        local_layout.addLayout(folder_row)
        local_layout.addWidget(splitter, 1)
        self.tabs = QTabWidget()
        self.tabs.addTab(local, "On this computer")
        self.tabs.addTab(self.hub, "Download from Hugging Face")
        QVBoxLayout(self).addWidget(self.tabs)

        self.open_folder.clicked.connect(
            lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(self._library().root))))
        self.refresh_button.clicked.connect(self.refresh)
        self.table.selectionModel().currentRowChanged.connect(lambda index, _: self._on_select(index.row()))
        self.load_button.clicked.connect(self.load_selected)
        self.unload_button.clicked.connect(lambda: self.host.unload())
        self.delete_button.clicked.connect(self.delete_selected)

    # -- the folder -------------------------------------------------------------------------------
    def refresh(self) -> None:
        library = self._library()
        library.root.mkdir(parents=True, exist_ok=True)
        self.folder.setText(str(library.root))
        self.worker.submit(lambda ctx: list_models(library), on_done=self._on_listed, owner=self)

    def _on_listed(self, result: TaskResult[list[ModelEntry]]) -> None:
        selected = self.selected()
        entries = result.value or []
        if not result.ok:
            self.notice.setText(f"Cannot read the models folder: {result.error_message}")
        self._embedded_path = str(entries[0].path) if entries and entries[0].name == EMBEDDED_NAME else ""
        self.entries.replace(entries)
        self.entries.set_loaded(self.runtime.status.path)
        names = [e.name for e in entries]
        row = names.index(selected.name) if selected is not None and selected.name in names else 0
        if entries:
            self.table.selectRow(row)
        self._update_buttons()
        self.listed.emit(result)

    def selected(self) -> ModelEntry | None:
        return self.entries.entry(self.table.currentIndex().row())

    def select(self, name: str) -> None:
        for row in range(self.entries.rowCount()):
            entry = self.entries.entry(row)
            if entry is not None and entry.name == name:
                self.table.selectRow(row)
                return

    def _on_select(self, row: int) -> None:
        entry = self.entries.entry(row)
        self._update_buttons()
        if entry is None:
            return
        self.details.setText(describe(entry))
        if entry.shape is None:
            self.fit.show_error(entry.error or "This model's shape is unknown, so its memory cannot be predicted.")
            return
        self._fit_asked += 1
        asked, shape, options, job = self._fit_asked, entry.shape, fit_options(self.settings), entry.job
        settings = self.settings
        self.fit.show_pending("Checking free memory…")
        self.worker.submit(lambda ctx: estimate(shape, options, job=job, beside=task_models_beside(settings)),
                           on_done=lambda result: self._on_fit(result, asked), owner=self)

    def _on_fit(self, result: TaskResult[FitEstimate], asked: int) -> None:
        if asked != self._fit_asked:
            return
        self.fit.show_result(result)
        self.fit_checked.emit(result)

    # -- actions ------------------------------------------------------------------------------
    def load_selected(self) -> None:
        entry = self.selected()
        if entry is None or self.runtime.status.busy:
            return
        question = wont_fit_question(entry, self.fit.report)
        if question is not None and not self.dialogs.confirm(self, LOAD_ANYWAY, question):
            return
        try:
            load_entry(self.host, self.settings, entry)
        except ValueError as exc:
            self.notice.setText(f"Cannot load: {exc}")

    def delete_selected(self) -> None:
        entry = self.selected()
        if entry is None or str(entry.path) == self._embedded_path or entry.location is not None:
            return
        if str(entry.path) == self.runtime.status.path:
            self.notice.setText("Unload the model before deleting it.")
            return
        if not self.dialogs.confirm(self, "Delete model", f"Delete {entry.name} ({len(entry.files)} file(s)) "
                                                          f"from {self._library().root}?"):
            return
        library = self._library()
        self.worker.submit(lambda ctx: library.delete(entry), on_done=self._on_deleted, owner=self)

    def _on_deleted(self, result: TaskResult[None]) -> None:
        self.notice.setText("" if result.ok else f"Could not delete: {result.error_message}")
        self.refresh()

    def show_recommended(self) -> None:
        self.tabs.setCurrentWidget(self.hub)
        self.hub.show_recommended()

    def shutdown(self) -> None:
        self.hub.shutdown()

    def _on_runtime(self, status: RuntimeStatus) -> None:
        self.entries.set_loaded(status.path if status.ready else "")
        if status.state == "error" or status.problem:  # a failed switch: the old model is still loaded
            self.notice.setText(status.message)
        elif status.ready:
            self.notice.setText(f"Loaded {status.model}.")
        self._update_buttons()

    def _update_buttons(self) -> None:
        entry, status = self.selected(), self.runtime.status
        loaded = entry is not None and status.ready and str(entry.path) == status.path
        self.load_button.setEnabled(entry is not None and not status.busy and not loaded
                                    and entry.architecture is not None and not entry.incomplete)
        self.unload_button.setEnabled(status.ready and not status.busy)
        self.delete_button.setEnabled(entry is not None and str(entry.path) != self._embedded_path and not loaded
                                      and entry.location is None)  # another application's file: not ours to delete



def describe(entry: ModelEntry) -> str:
    """Details beside the table (rich text): what the model is, its quantization mix, its files."""
    name = html.escape(entry.name)
    if entry.error and entry.architecture is None:
        return f"<b>{name}</b><br>{html.escape(entry.error)}"
    total = sum(n for _, n in entry.quant_mix) or 1
    mix = ", ".join(f"{kind} {100 * n / total:.0f}%" for kind, n in entry.quant_mix[:6])
    what = f"{entry.architecture or '?'} · {count(entry.parameters)} parameters"
    if entry.context_length:
        what += f" · context {entry.context_length:,} tokens"
    files = ", ".join(f.name for f in entry.files[:4]) + (" …" if len(entry.files) > 4 else "")
    lines = [f"<b>{name}</b>", what, f"Does: {html.escape(entry.job or '?')}",
             f"Quantization: {entry.quantization or '?'}" + (f" ({mix})" if mix else ""), f"Files: {html.escape(files)}"]
    if entry.job_note:
        lines.append(f"Job: {entry.job_note[0]}: {html.escape(entry.job_note[1])}")
    if entry.vision:
        lines.append(f"Takes images: its vision tower is {html.escape(entry.vision)}")
    if entry.job == "transcription":
        audio = entry.shape.audio if entry.shape else None
        family = f"a {audio.family} " if audio else "a "
        lines.append(f"Job: transcription. It is {family}speech model: choose its folder in the Transcribe pane, or "
                     "serve it with <code>paddock serve --asr-model</code> at /v1/audio/transcriptions")
    if entry.location:
        lines.append(f"Found in {html.escape(entry.location)}'s folder, used in place (not copied): "
                     f"{html.escape(str(entry.path.parent))}")
    if entry.error:
        lines.append(f"<span style='color:#c62828'>{html.escape(entry.error)}</span>")
    return "<br>".join(lines)
