"""The Chat pane: conversations, a streaming transcript, stop and regenerate, system prompt and sampling.

The pane only arranges widgets and forwards clicks: prompts, streaming, History writes
and statistics are `ChatService`'s (app/studio/chat.py). Answers stream on the qasync
loop, so each delta lands in the transcript as it arrives without a thread hop.

Documents dropped anywhere on the pane are read and embedded on a worker (`DocumentSet`,
app/studio/doc_qa.py); while any are attached, each question goes out with its most
relevant excerpts, numbered under their citations, so the answer can cite them.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from PySide6.QtCore import QItemSelection, Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListView,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.studio.chat import Answer, ChatService, ChatSettings
from app.studio.doc_qa import DocQAError, DocumentSet, IngestReport, chat_message, is_document_file
from app.studio.history import History, Message
from app.studio.runtime import RuntimeStatus
from app.studio.tasks import Progress, TaskHandle, TaskResult
from app.ui.context import RuntimeWatcher
from app.ui.models.conversations import ConversationListModel
from app.ui.widgets.dialogs import Dialogs
from app.ui.widgets.drop_zone import FileDropFilter
from app.ui.widgets.feedback import error_label, show_error, show_progress
from app.ui.widgets.sampling_form import SamplingForm
from app.ui.widgets.transcript import TranscriptView
from app.ui.workers import Worker


class ChatPane(QWidget):
    answer_finished = Signal(object)  # TaskResult[Answer]: the answer, or why there is none
    attach_finished = Signal(object)  # TaskResult[IngestReport]: documents dropped on the chat were read

    def __init__(self, chat: ChatService, history: History, runtime: RuntimeWatcher, worker: Worker,
                 dialogs: Dialogs, defaults: Callable[[], ChatSettings], default_system_prompt: Callable[[], str],
                 documents: DocumentSet | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.chat, self.history, self.runtime, self.worker, self.dialogs = chat, history, runtime, worker, dialogs
        self._defaults, self._default_system_prompt = defaults, default_system_prompt
        # the embedding model loads only when a document is first dropped
        self.documents = documents if documents is not None else DocumentSet()
        self._attaching: TaskHandle[IngestReport] | None = None
        self.conversation_id: int | None = None
        self._answering = False  # from the click until the answer's outcome is shown
        self._build()
        self.runtime.status_changed.connect(self._on_runtime)
        self._on_runtime(runtime.status)
        self.refresh_conversations()
        first = self.conversations.conversation_at(0)
        if first is not None:
            self.open_conversation(first.id)
        else:
            self.new_chat()

    # -- layout ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.new_button = QPushButton("New chat")
        self.conversations = ConversationListModel()
        self.conversation_list = QListView()
        self.conversation_list.setModel(self.conversations)
        self.conversation_list.setSelectionMode(QListView.SelectionMode.SingleSelection)
        self.delete_button = QPushButton("Delete")
        left = _column(self.new_button, self.conversation_list, self.delete_button)

        self.model_hint = QLabel()
        self.model_hint.setObjectName("hintText")
        self.model_hint.setWordWrap(True)
        self.transcript = TranscriptView()
        self.error = error_label(hidden=True)
        self.attachments = QLabel()
        self.attachments.setObjectName("mutedText")
        self.attachments.setWordWrap(True)
        self.attach_progress = QProgressBar()
        self.attach_cancel_button = QPushButton("Cancel")
        self.detach_button = QPushButton("Detach documents")
        attach_row = QHBoxLayout()
        attach_row.addWidget(self.attachments, 1)
        attach_row.addWidget(self.attach_progress)
        attach_row.addWidget(self.attach_cancel_button)
        attach_row.addWidget(self.detach_button)
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Message the model… (Ctrl+Enter sends)")
        self.input.setMaximumHeight(110)
        self.regenerate_button = QPushButton("Regenerate")
        self.stop_button = QPushButton("Stop")
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.regenerate_button)
        buttons.addStretch(1)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)
        center = _column(self.model_hint, self.transcript, self.error)
        center.layout().addLayout(attach_row)
        center.layout().addWidget(self.input)
        center.layout().addLayout(buttons)

        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("e.g. You are a concise assistant.")
        self.sampling = SamplingForm()
        system_box, sampling_box = QGroupBox("System prompt"), QGroupBox("Sampling")
        _column(self.system_prompt, into=system_box)
        _column(self.sampling, into=sampling_box)
        right = _column(system_box, sampling_box)
        right.layout().addStretch(1)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        for widget, stretch in ((left, 0), (center, 1), (right, 0)):
            splitter.addWidget(widget)
            splitter.setStretchFactor(splitter.count() - 1, stretch)
        splitter.setSizes([200, 640, 260])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

        self.new_button.clicked.connect(self.new_chat)
        self.delete_button.clicked.connect(self.delete_conversation)
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.stop)
        self.regenerate_button.clicked.connect(self.regenerate)
        QShortcut(QKeySequence("Ctrl+Return"), self.input, activated=self.send)
        self.conversation_list.selectionModel().selectionChanged.connect(self._on_selection)
        self.drops = FileDropFilter(self)
        self.drops.watch(self, self.transcript, self.input)
        self.drops.files_dropped.connect(self.attach_files)
        self.attach_cancel_button.clicked.connect(self.cancel_attach)
        self.detach_button.clicked.connect(self.detach_documents)
        self._show_attachments()

    @property
    def busy(self) -> bool:
        return self._answering or self.chat.busy

    # -- conversations ------------------------------------------------------------------------
    def refresh_conversations(self) -> None:
        self.conversations.replace(self.history.conversations())
        self._select_row(self.conversations.row_of(self.conversation_id) if self.conversation_id else -1)

    def new_chat(self) -> None:
        if self.busy:
            return
        self._keep_settings()
        self.conversation_id = None
        self.transcript.show_conversation(None)
        self.system_prompt.setPlainText(self._default_system_prompt())
        self.sampling.set_settings(self._defaults())
        self._select_row(-1)
        self._show_error(None)
        self._update_buttons()

    def open_conversation(self, conversation_id: int) -> None:
        if self.busy or conversation_id == self.conversation_id:
            return
        self._keep_settings()
        conversation = self.history.conversation(conversation_id)
        self.conversation_id = conversation_id
        self.system_prompt.setPlainText(conversation.system_prompt)
        self.sampling.set_settings(self.chat.settings_of(conversation, self._defaults()))
        self.transcript.show_conversation(conversation)
        self._select_row(self.conversations.row_of(conversation_id))
        self._show_error(None)
        self._update_buttons()

    def delete_conversation(self) -> None:
        if self.conversation_id is None or self.busy:
            return
        title = self.history.conversation(self.conversation_id, with_messages=False).title or "this conversation"
        if not self.dialogs.confirm(self, "Delete conversation", f"Delete “{title}” and all its messages?"):
            return
        self.history.delete_conversation(self.conversation_id)
        self.conversation_id = None
        self.refresh_conversations()
        first = self.conversations.conversation_at(0)
        if first is not None:
            self.open_conversation(first.id)
        else:
            self.new_chat()

    # -- documents dropped on the chat ----------------------------------------------------------
    def attach_files(self, paths: list[Path]) -> None:
        """Read and embed dropped documents; the next questions are answered from them."""
        if self._attaching is not None:
            self._show_error("Documents are still being read: wait for them, or cancel.")
            return
        others = [path.name for path in paths if not is_document_file(path)]
        if others:
            self._show_error(f"{', '.join(others)}: only PDF, Word, Excel, text and Markdown files can be attached "
                             "to a chat (audio goes to the Transcribe pane).")
        paths = [path for path in paths if is_document_file(path)]
        if not paths:
            return
        if not others:
            self._show_error(None)
        self._show_attach_progress(Progress(0, None, "Reading…"))
        documents = self.documents
        self._attaching = self.worker.submit(
            lambda ctx: documents.ingest(paths, progress=ctx.report, cancel=lambda: ctx.token.cancelled),
            on_done=self._on_attached, on_progress=self._show_attach_progress, owner=self)

    def cancel_attach(self) -> None:
        if self._attaching is not None:
            self._attaching.cancel()

    def shutdown(self) -> None:
        """The window is closing: stop reading documents (answers are stopped by the window)."""
        self.cancel_attach()

    def detach_documents(self) -> None:
        if self._attaching is None:
            self.documents.clear()
            self._show_attachments()

    def _on_attached(self, result: TaskResult[IngestReport]) -> None:
        self._attaching = None
        report = result.value
        if result.error is not None:
            self._show_error(f"The documents could not be read: {result.error_message}")
        elif report is not None and report.failed:
            self._show_error("\n".join(failure.message for failure in report.failed))
        self._show_attachments()
        self.attach_finished.emit(result)

    def _show_attachments(self) -> None:
        documents = self.documents.documents
        names = "; ".join(f"{d.name} ({d.describe()})" for d in documents)
        self.attachments.setText(f"Attached: {names}. Answers cite them." if documents
                                 else "Drop a PDF, Word, Excel or text file here to ask about it.")
        self.attach_progress.hide()
        self.attach_cancel_button.hide()
        self.detach_button.setVisible(bool(documents))

    def _show_attach_progress(self, progress: Progress) -> None:
        show_progress(self.attach_progress, self.attachments, self.attach_cancel_button, progress)
        self.detach_button.hide()

    # -- answers ------------------------------------------------------------------------------
    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or self.busy or not self.runtime.status.ready:
            return
        message = text
        if len(self.documents):
            try:
                message = chat_message(text, self.documents.retrieve(text))
            except DocQAError as exc:
                self._show_error(str(exc))
                return
        conversation_id = self._current_conversation()
        self.input.clear()
        self._start(self.chat.send(conversation_id, message, on_start=self._on_start, on_delta=self._on_delta),
                    unsent=text, sent=message)

    def regenerate(self) -> None:
        if self.conversation_id is None or self.busy:
            return
        self.chat.configure(self.conversation_id, self.system_prompt.toPlainText(), self.sampling.settings())
        self._start(self.chat.regenerate(self.conversation_id, on_start=self._on_start, on_delta=self._on_delta))

    def stop(self) -> None:
        self.chat.stop()

    def _start(self, coro: Coroutine[Any, Any, Answer], unsent: str = "", sent: str = "") -> None:
        self._show_error(None)
        self._answering = True
        self.worker.spawn(coro, on_done=lambda result: self._on_answer(result, unsent, sent or unsent), owner=self)
        self._update_buttons()

    def _on_start(self, message: Message) -> None:
        self.refresh_conversations()  # a first question names the conversation
        self.transcript.show_conversation(self.history.conversation(message.conversation_id))
        self._update_buttons()

    def _on_delta(self, message_id: int, text: str) -> None:
        self.transcript.append_delta(text)

    def _on_answer(self, result: TaskResult[Answer], unsent: str, sent: str) -> None:
        self._answering = False
        answer = result.value
        if result.error is not None:
            self._show_error(result.error_message)
            if unsent and not self._has_question(sent):  # refused before it was saved: give the text back
                self.input.setPlainText(unsent)
        elif answer is not None and answer.status == "error":
            self._show_error(f"The answer failed: {answer.error}")
        if self.conversation_id is not None:
            self.transcript.show_conversation(self.history.conversation(self.conversation_id))
        self.refresh_conversations()
        self._update_buttons()
        self.answer_finished.emit(result)

    # -- state ----------------------------------------------------------------------------------
    def _current_conversation(self) -> int:
        if self.conversation_id is None:
            created = self.chat.new_conversation(self.system_prompt.toPlainText(), self.sampling.settings())
            self.conversation_id = created.id
        else:
            self._keep_settings()
        return self.conversation_id

    def _keep_settings(self) -> None:
        """Save the system prompt and sampling edits into the conversation they were made for."""
        if self.conversation_id is not None and not self.busy:
            self.chat.configure(self.conversation_id, self.system_prompt.toPlainText(), self.sampling.settings())

    def _has_question(self, text: str) -> bool:
        if self.conversation_id is None:
            return False
        messages = self.history.conversation(self.conversation_id).messages
        return any(m.role == "user" and m.content == text for m in messages)

    def _on_selection(self, selected: QItemSelection, _deselected: QItemSelection) -> None:
        indexes = selected.indexes()
        if indexes:
            conversation = self.conversations.conversation_at(indexes[0].row())
            if conversation is not None:
                self.open_conversation(conversation.id)

    def _select_row(self, row: int) -> None:
        selection = self.conversation_list.selectionModel()
        selection.blockSignals(True)  # selecting to mirror state is not a user's choice
        if row < 0:
            selection.clearSelection()
        else:
            self.conversation_list.setCurrentIndex(self.conversations.index(row))
        selection.blockSignals(False)

    def _on_runtime(self, status: RuntimeStatus) -> None:
        if status.state == "unloading":
            self.chat.stop()  # the engine is going away: end the answer cleanly
        hints = {"ready": "", "loading": status.message, "unloading": status.message,
                 "error": f"{status.message} Load another model in the Models pane."}
        hint = hints.get(status.state, "No model is loaded: load one in the Models pane.")
        self.model_hint.setText(hint)
        self.model_hint.setVisible(bool(hint))
        self._update_buttons()

    def _update_buttons(self) -> None:
        busy = self.busy
        ready = self.runtime.status.ready
        self.send_button.setEnabled(ready and not busy)
        self.stop_button.setEnabled(busy)
        has_question = self.conversation_id is not None and any(
            m.role == "user" for m in self.history.conversation(self.conversation_id).messages)
        self.regenerate_button.setEnabled(ready and not busy and has_question)
        for widget in (self.new_button, self.delete_button, self.conversation_list):
            widget.setEnabled(not busy)

    def _show_error(self, text: str | None) -> None:
        show_error(self.error, text)


def _column(*widgets: QWidget, into: QWidget | None = None) -> QWidget:
    holder = into or QWidget()
    layout = QVBoxLayout(holder)
    if into is None:
        layout.setContentsMargins(0, 0, 0, 0)
    for widget in widgets:
        layout.addWidget(widget)
    return holder
