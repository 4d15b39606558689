"""The Chat pane: conversations, a streaming transcript, stop and regenerate, system prompt and sampling.

The pane only arranges widgets and forwards clicks: prompts, streaming, History writes
and statistics are `ChatService`'s (app/studio/chat.py). Answers stream on the qasync
loop, so each delta lands in the transcript as it arrives without a thread hop.

Documents dropped anywhere on the pane are read and embedded on a worker (`DocumentSet`,
app/studio/doc_qa.py); while any are attached, each question goes out with its most
relevant excerpts, numbered under their citations, so the answer can cite them. A scanned PDF
(no text to search) dropped or attached goes with the next message as its pages' images when the
model has vision (app/studio/attachments.py renders them at the model's resolution), and with a
text-only model the pane says, in the Documents pane's words, that a vision model is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from PySide6.QtCore import QItemSelection, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.studio.attachments import ReadFiles, is_image_file, read_files
from app.studio.chat import Answer, ChatService, ChatSettings
from app.studio.doc_qa import (
    DocQAError,
    DocumentSet,
    IngestReport,
    is_document_file,
)
from app.studio.history import Attachment, History, Message
from app.studio.runtime import RuntimeStatus
from app.studio.tasks import Progress, TaskHandle, TaskResult
from app.ui.context import RuntimeWatcher
from app.ui.models.conversations import ConversationListModel
from app.ui.widgets.attachment_tray import AttachmentTray
from app.ui.widgets.chat_input import ChatInput
from app.ui.widgets.dialogs import Dialogs
from app.ui.widgets.drop_zone import FileDropFilter
from app.ui.widgets.feedback import error_label, show_error, show_progress
from app.ui.widgets.model_picker import ModelPicker
from app.ui.widgets.sampling_form import SamplingForm
from app.ui.widgets.transcript import TranscriptView
from app.ui.workers import Worker

LIVE_MS = 250  # how often the streaming answer's speed and elapsed time are refreshed
ATTACH_FILTER = ("Documents and images (*.pdf *.docx *.xlsx *.xlsm *.txt *.md *.markdown *.csv *.png *.jpg *.jpeg "
                 "*.webp *.gif *.bmp);;All files (*)")


class ChatPane(QWidget):
    answer_finished = Signal(object)  # TaskResult[Answer]: the answer, or why there is none
    attach_finished = Signal(object)  # TaskResult[IngestReport]: documents dropped on the chat were read
    chat_model_wanted = Signal()  # "Get a chat model" beside the base-model note
    files_read = Signal(object)  # TaskResult[ReadFiles]: files chosen for the next message were read

    def __init__(self, chat: ChatService, history: History, runtime: RuntimeWatcher, worker: Worker,
                 dialogs: Dialogs, defaults: Callable[[], ChatSettings], default_system_prompt: Callable[[], str],
                 documents: DocumentSet | None = None, parent: QWidget | None = None, *,
                 copy_text: Callable[[str], None] | None = None, enter_sends: Callable[[], bool] = lambda: True,
                 model_picker: ModelPicker | None = None) -> None:
        super().__init__(parent)
        self.model_picker = model_picker
        self._copy, self._enter_sends = copy_text or (lambda text: None), enter_sends
        self._editing: int | None = None  # the question being edited: sending replaces it and what follows
        self.chat, self.history, self.runtime, self.worker, self.dialogs = chat, history, runtime, worker, dialogs
        self._defaults, self._default_system_prompt = defaults, default_system_prompt
        # the embedding model loads only when a document is first dropped; a scanned PDF is kept (it has
        # nothing to search) so that the pane can send its pages to a vision model instead
        self.documents = documents if documents is not None else DocumentSet(keep_scanned=True)
        self._attaching: TaskHandle[IngestReport] | None = None
        self._reading: TaskHandle[ReadFiles] | None = None  # files being read for the next message
        self._waiting: list[Path] = []  # files to read for the next message once the reading now is done
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
        self.new_button.setToolTip("Ctrl+N")
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.conversations = ConversationListModel()
        self.conversation_list = QListView()
        self.conversation_list.setModel(self.conversations)
        self.conversation_list.setSelectionMode(QListView.SelectionMode.SingleSelection)
        # a long title ends in "…" (its tooltip has it whole) instead of a clipped row and a sideways scroll bar
        self.conversation_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conversation_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.delete_button = QPushButton("Delete")
        self.rename_button = QPushButton("Rename")
        list_buttons = QWidget()
        list_row = QHBoxLayout(list_buttons)
        list_row.setContentsMargins(0, 0, 0, 0)
        list_row.addWidget(self.rename_button)
        list_row.addWidget(self.delete_button)
        left = _column(self.new_button, self.search, self.conversation_list, list_buttons)

        header = QHBoxLayout()
        if self.model_picker is not None:
            header.addWidget(QLabel("Model"))
            header.addWidget(self.model_picker, 1)
            self.model_picker.refused.connect(self._show_error)
        self.model_hint = QLabel()
        self.model_hint.setObjectName("hintText")
        self.model_hint.setWordWrap(True)
        self.base_note_text = QLabel()
        self.base_note_text.setObjectName("hintText")
        self.base_note_text.setWordWrap(True)  # never widens the window
        self.get_chat_model = QPushButton("Get a chat model")
        self.get_chat_model.clicked.connect(self.chat_model_wanted.emit)
        self.base_note = QWidget()
        note_row = QHBoxLayout(self.base_note)
        note_row.setContentsMargins(0, 0, 0, 0)
        note_row.addWidget(self.base_note_text, 1)
        note_row.addWidget(self.get_chat_model)
        self.base_note.hide()
        self.transcript = TranscriptView(self._copy)
        self.raw_view = QCheckBox("Raw")
        self.raw_view.setToolTip("Show answers as the model wrote them, Markdown unrendered")
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
        self.tray = AttachmentTray()
        self.attach_button = QPushButton("Attach…")
        self.attach_button.setToolTip("Send files with your next message: PDF, Word, Excel or text files as their "
                                      "text; images when the model has vision")
        self.input = ChatInput(self._enter_sends)
        self.input.setMaximumHeight(110)
        self.edit_note = QLabel()
        self.edit_note.setObjectName("hintText")
        self.edit_note.setWordWrap(True)
        self.edit_note.hide()
        self.live = QLabel()  # tokens/s and elapsed time while an answer streams
        self.live.setObjectName("mutedText")
        self._live_timer = QTimer(self)
        self._live_timer.setInterval(LIVE_MS)
        self._live_timer.timeout.connect(self._show_live)
        self.regenerate_button = QPushButton("Regenerate")
        self.stop_button = QPushButton("Stop")
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.attach_button)
        buttons.addWidget(self.regenerate_button)
        buttons.addWidget(self.raw_view)
        buttons.addWidget(self.live, 1)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)
        center = _column(self.model_hint, self.base_note, self.transcript, self.error)
        center.layout().insertLayout(0, header)
        center.layout().addLayout(attach_row)
        center.layout().addWidget(self.tray)
        center.layout().addWidget(self.edit_note)
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
        self.attach_button.clicked.connect(self.choose_attachments)
        self.input.submitted.connect(self.send)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self.stop,
                  context=Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.rename_button.clicked.connect(self.rename_conversation)
        self.search.textChanged.connect(lambda _: self.refresh_conversations())
        self.raw_view.toggled.connect(self.transcript.set_raw)
        self.transcript.action.connect(self._on_message_action)
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
        self.conversations.replace(self.history.conversations(self.search.text().strip() or None))
        self._select_row(self.conversations.row_of(self.conversation_id) if self.conversation_id else -1)

    def new_chat(self) -> None:
        self._keep_settings()
        self._set_editing(None)
        self.conversation_id = None
        self.transcript.show_conversation(None)
        self.system_prompt.setPlainText(self._default_system_prompt())
        self.sampling.set_settings(self._defaults())
        self._select_row(-1)
        self._show_error(None)
        self._update_buttons()

    def open_conversation(self, conversation_id: int) -> None:
        """Show a conversation (also while another one's answer streams on in the background)."""
        if conversation_id == self.conversation_id:
            return
        self._keep_settings()
        self._set_editing(None)
        conversation = self.history.conversation(conversation_id)
        self.conversation_id = conversation_id
        self.system_prompt.setPlainText(conversation.system_prompt)
        self.sampling.set_settings(self.chat.settings_of(conversation, self._defaults()))
        self._render()
        self._select_row(self.conversations.row_of(conversation_id))
        self._show_error(None)
        self._update_buttons()

    def delete_conversation(self) -> None:
        if self.conversation_id is None or self.conversation_id == self.chat.streaming_conversation:
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

    def rename_conversation(self) -> None:
        if self.conversation_id is None:
            return
        title = self.history.conversation(self.conversation_id, with_messages=False).title
        new = self.dialogs.ask_text(self, "Rename conversation", "Title", title)
        if new is not None and new.strip():
            self.history.update_conversation(self.conversation_id, title=new.strip())
            self.refresh_conversations()

    # -- one message's actions (links in its header) -------------------------------------------
    def _on_message_action(self, what: str, message_id: int, _n: int) -> None:
        message = self.history.message(message_id)
        if what == "copy":
            self._copy(message.content)
        elif what == "edit" and not self.busy:
            self.input.setPlainText(message.content)
            self.tray.clear()  # its files go again with the edited question, unless removed
            self.tray.add(self.history.conversation(message.conversation_id).attachments.get(message_id, ()))
            self.input.setFocus()
            self._set_editing(message_id)
        elif what == "delete" and not (self.busy and message.conversation_id == self.chat.streaming_conversation):
            if self.dialogs.confirm(self, "Delete message", "Delete this message?"):
                self.history.delete_message(message_id)
                self._render()
        elif what == "version" and not self.busy:
            self.history.show_version(message_id)
            self._render()
        self._update_buttons()

    def _set_editing(self, message_id: int | None) -> None:
        self._editing = message_id
        self.edit_note.setText("Editing a question: Send replaces it and everything after it." if message_id
                               else "")
        self.edit_note.setVisible(message_id is not None)

    def _render(self) -> None:
        """The current conversation in the transcript, with the versions of its answers."""
        if self.conversation_id is None:
            self.transcript.show_conversation(None)
            return
        conversation = self.history.conversation(self.conversation_id)
        versions = {}
        for message in conversation.messages:
            if message.role == "assistant":
                group = self.history.versions(message.id)
                if len(group) > 1:
                    versions[message.id] = group
        self.transcript.show_conversation(conversation, versions=versions)

    # -- documents dropped on the chat ----------------------------------------------------------
    def attach_files(self, paths: list[Path]) -> None:
        """Read and embed dropped documents; the next questions are answered from them."""
        images = [path for path in paths if is_image_file(path)]
        if images:
            self.attach_to_message(images)
        paths = [path for path in paths if not is_image_file(path)]
        if not paths:
            return
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
        if self._reading is not None:
            self._reading.cancel()

    # -- files sent with the next message ------------------------------------------------------
    def choose_attachments(self) -> None:
        paths = self.dialogs.open_paths(self, "Attach files", ATTACH_FILTER)
        if paths:
            self.attach_to_message([Path(path) for path in paths])

    def attach_to_message(self, paths: list[Path]) -> None:
        """Read the files (documents to text, on the worker) to send them with the next message."""
        if self._reading is not None:  # read after these (a drop's scanned PDF arrives while images are read)
            self._waiting.extend(paths)
            return
        images = [path.name for path in paths if is_image_file(path)]
        if images and self.runtime.status.ready and not self.chat.supports_vision:
            self._show_error(f"{self.runtime.status.model} reads text only, so it cannot see {', '.join(images)}: "
                             "load a model with vision (such as Gemma 3 with its mmproj file) to attach images.")
            paths = [path for path in paths if not is_image_file(path)]
            if not paths:
                return
        else:
            self._show_error(None)
        scale = self.chat.page_scale()  # a scanned PDF's pages at the loaded vision model's resolution
        self._reading = self.worker.submit(lambda ctx: read_files(paths, lambda: ctx.token.cancelled, scale),
                                           on_done=self._on_read, owner=self)
        self._update_buttons()

    def _on_read(self, result: TaskResult[ReadFiles]) -> None:
        self._reading = None
        if result.value is not None:
            self.tray.add(result.value.attachments)
            if result.value.problems:
                self._show_error("\n".join(result.value.problems))
        elif result.error is not None:
            self._show_error(f"The files could not be read: {result.error_message}")
        self._update_buttons()
        self.files_read.emit(result)
        waiting, self._waiting = self._waiting, []
        if waiting and not result.cancelled:
            self.attach_to_message(waiting)

    def shutdown(self) -> None:
        """The window is closing: stop reading documents (answers are stopped by the window)."""
        self.cancel_attach()

    def detach_documents(self) -> None:
        if self._attaching is None:
            self.documents.clear()
            self._show_attachments()

    def _on_attached(self, result: TaskResult[IngestReport]) -> None:
        self._attaching = None
        dropped = self.chat.route_dropped(self.documents, result.value)
        if dropped.as_pages:  # first: reading them clears the error row, which may say more below
            self.attach_to_message(dropped.as_pages)
        if result.error is not None:
            self._show_error(f"The documents could not be read: {result.error_message}")
        elif dropped.problems:
            self._show_error("\n".join(dropped.problems))
        self._show_attachments()
        self.attach_finished.emit(result)

    def _show_attachments(self) -> None:
        documents = self.documents.documents
        names = "; ".join(f"{d.name} ({d.describe()})" for d in documents)
        self.attachments.setText(f"Attached: {names}. Answers cite them." if documents
                                 else "Drop a PDF, Word, Excel or text file here to search it as you ask (answers cite it); "
                                 "Attach… sends a file whole with your next message.")
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
        try:
            message = self.chat.question(text, self.documents)  # with the documents' excerpts, if any is close
        except DocQAError as exc:
            self._show_error(str(exc))
            return
        conversation_id = self._current_conversation()
        replacing = self._editing  # edit and resend: the old question and what followed it go
        self._set_editing(None)
        self.input.clear()
        files = self.tray.take()
        self._start(self.chat.ask(conversation_id, message, replacing=replacing, attachments=files,
                                  on_start=self._on_start, on_delta=self._on_delta),
                    unsent=text, sent=message, files=files)

    def regenerate(self) -> None:
        if self.conversation_id is None or self.busy:
            return
        self.chat.configure(self.conversation_id, self.system_prompt.toPlainText(), self.sampling.settings())
        self._start(self.chat.regenerate(self.conversation_id, on_start=self._on_start, on_delta=self._on_delta))

    def stop(self) -> None:
        self.chat.stop()

    def _start(self, coro: Coroutine[Any, Any, Answer], unsent: str = "", sent: str = "",
               files: list[Attachment] | None = None) -> None:
        self._show_error(None)
        self._answering = True
        self._live_timer.start()
        self.worker.spawn(coro, on_done=lambda result: self._on_answer(result, unsent, sent or unsent, files or []),
                          owner=self)
        self._update_buttons()

    def _on_start(self, message: Message) -> None:
        self.refresh_conversations()  # a first question names the conversation
        if message.conversation_id == self.conversation_id:
            self._render()
        self._update_buttons()

    def _on_delta(self, message_id: int, text: str) -> None:
        if self.chat.streaming_conversation == self.conversation_id:  # another one may be open meanwhile
            self.transcript.append_delta(text)
        self._show_live()

    def _show_live(self) -> None:
        live = self.chat.live_stats()
        if live is None:
            return
        stats, elapsed = live
        speed = f"{stats.tokens_per_s:.1f} tok/s · " if stats.tokens_per_s else ""
        self.live.setText(f"{speed}{stats.completion_tokens or 0} tokens · {elapsed:.1f} s")

    def _on_answer(self, result: TaskResult[Answer], unsent: str, sent: str, files: list[Attachment]) -> None:
        self._answering = False
        self._live_timer.stop()
        self.live.setText("")
        answer = result.value
        if result.error is not None:
            self._show_error(result.error_message)
            if unsent and not self._has_question(sent):  # refused before it was saved: give it all back
                self.input.setPlainText(unsent)
                self.tray.add(files)
        elif answer is not None and answer.status == "error":
            self._show_error(f"The answer failed: {answer.error}")
        self._render()
        self.refresh_conversations()
        self._update_buttons()
        self.answer_finished.emit(result)

    # -- state ----------------------------------------------------------------------------------
    def _current_conversation(self) -> int:
        """Only asked while not busy (send), so the open conversation's settings are saved as _keep_settings does."""
        self.conversation_id = self.chat.conversation_for(self.conversation_id, self.system_prompt.toPlainText(),
                                                          self.sampling.settings())
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
        hints = {"ready": status.message if status.problem else "", "loading": status.message, "unloading": status.message,
                 "error": f"{status.message} Load another model in the Models pane."}
        hint = hints.get(status.state, "No model is loaded: load one in the Models pane.")
        self.model_hint.setText(hint)
        self.model_hint.setVisible(bool(hint))
        base = status.ready and status.base  # its echoes and rambling are what base models do, not a bug
        self.base_note_text.setText(f"{status.model} is a base model: it continues text rather than answering "
                                    f"questions." if base else "")
        self.base_note.setVisible(base)
        self._update_buttons()

    def _update_buttons(self) -> None:
        busy = self.busy
        ready = self.runtime.status.ready
        self.send_button.setEnabled(ready and not busy)
        self.stop_button.setEnabled(busy)
        has_question = self.conversation_id is not None and any(
            m.role == "user" for m in self.history.conversation(self.conversation_id).messages)
        self.regenerate_button.setEnabled(ready and not busy and has_question)
        self.attach_button.setEnabled(self._reading is None)
        self.delete_button.setEnabled(self.conversation_id is not None
                                      and self.conversation_id != self.chat.streaming_conversation)
        self.rename_button.setEnabled(self.conversation_id is not None)

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
