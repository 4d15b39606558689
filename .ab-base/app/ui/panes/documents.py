"""The Documents pane: drop files, watch them being read and embedded, ask questions, follow the citations.

Reading and embedding run on a worker (`Worker.submit`) with a progress bar and Cancel;
answers stream on the qasync loop (`Worker.spawn`). Everything about documents, retrieval
and prompts is `DocQASession`'s (app/studio/doc_qa.py); the pane arranges and forwards.
With a vision model loaded, a question reads the PDFs' pages as images, page by page under the
same progress bar (Cancel or Stop ends it), and the answer cites the pages. With an OCR model set,
scanned pages are read by it while files are added (the mode line says so).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QStandardItem, QStandardItemModel, QTextCursor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.studio.doc_qa import Citation, DocAnswer, DocQASession, IngestReport, needs_vision_message
from app.studio.runtime import RuntimeStatus
from app.studio.tasks import Progress, TaskHandle, TaskResult
from app.ui.context import RuntimeWatcher
from app.ui.widgets.drop_zone import DropZone, FileChooser, FileDropFilter, choose_files
from app.ui.widgets.feedback import error_label, show_error, show_progress
from app.ui.widgets.feedback import progress_row as progress_row_widgets
from app.ui.widgets.tables import make_table
from app.ui.workers import Worker

FILE_FILTERS = "Documents (*.pdf *.docx *.xlsx *.xlsm *.txt *.md *.markdown *.csv *.log);;All files (*)"
COLUMNS = ("Document", "Type", "Contents", "Excerpts")
MAX_NAME_WIDTH = 240  # pixels: a long file name is elided (its tooltip has the whole path)
KIND_NAMES = {"pdf": "PDF", "docx": "Word", "xlsx": "Excel", "text": "Text", "markdown": "Markdown"}
_CITE = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")


class DocumentsPane(QWidget):
    ingest_finished = Signal(object)  # TaskResult[IngestReport]
    answer_finished = Signal(object)  # TaskResult[DocAnswer]

    def __init__(self, session: DocQASession, runtime: RuntimeWatcher, worker: Worker,
                 chooser: FileChooser = choose_files, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session, self.runtime, self.worker = session, runtime, worker
        self._ingesting: TaskHandle[IngestReport] | None = None
        self._answering = False
        self._reading_pages = False  # the progress row follows a vision model through the pages
        self.citations: list[Citation] = []
        self.answer: DocAnswer | None = None
        self._build(chooser)
        self.runtime.status_changed.connect(self._on_runtime)
        self._on_runtime(runtime.status)
        self.refresh_documents()  # a set kept from the last session

    # -- layout ---------------------------------------------------------------------------
    def _build(self, chooser: FileChooser) -> None:
        self.drop_zone = DropZone("Drop PDF, Word, Excel, text or Markdown files here to ask questions about "
                                  "them. Nothing leaves this computer.", FILE_FILTERS, chooser=chooser)
        self.mode = QLabel()
        self.mode.setObjectName("mutedText")
        self.mode.setWordWrap(True)
        self.vision_notice = QLabel()  # scanned PDFs and a text-only model: what would read them
        self.vision_notice.setWordWrap(True)
        self.vision_notice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        progress_row, self.progress, self.progress_label, self.cancel_button = progress_row_widgets()
        self.error = error_label(selectable=True)

        self.documents = QStandardItemModel(0, len(COLUMNS))
        self.documents.setHorizontalHeaderLabels(COLUMNS)
        self.table = make_table(self.documents)
        self.table.setWordWrap(False)
        header = self.table.horizontalHeader()  # names and contents both matter: the contents take the slack
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.remove_button = QPushButton("Remove")
        self.clear_button = QPushButton("Remove all")
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.remove_button)
        buttons.addWidget(self.clear_button)
        left = _column(_heading("Documents"), self.table)
        left.layout().addLayout(buttons)

        self.question = QLineEdit()
        self.question.setPlaceholderText("Ask about your documents… (Enter asks)")
        self.ask_button = QPushButton("Ask")
        self.stop_button = QPushButton("Stop")
        ask_row = QHBoxLayout()
        ask_row.addWidget(self.question, 1)
        ask_row.addWidget(self.ask_button)
        ask_row.addWidget(self.stop_button)
        self.answer_view = QTextBrowser()
        self.answer_view.setOpenLinks(False)  # [n] links show their passage here, they go nowhere
        self.answer_view.setPlaceholderText("Answers stream in here, citing the page, sheet or section they use.")
        self.sources = QListWidget()
        self.sources.setMaximumHeight(110)
        self.excerpt_title = QLabel("Click an excerpt or a citation to read the passage.")
        self.excerpt = QPlainTextEdit()
        self.excerpt.setReadOnly(True)
        self.excerpt.setMaximumHeight(130)
        right = _column(_heading("Question"))
        right.layout().addLayout(ask_row)
        for widget in (self.answer_view, _heading("Excerpts given to the model"), self.sources,
                       self.excerpt_title, self.excerpt):
            right.layout().addWidget(widget)
        right.layout().setStretchFactor(self.answer_view, 1)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([480, 640])
        layout = QVBoxLayout(self)
        layout.addWidget(self.drop_zone)
        layout.addWidget(self.mode)
        layout.addWidget(self.vision_notice)
        layout.addLayout(progress_row)
        layout.addWidget(self.error)
        layout.addWidget(splitter, 1)

        self.drop_zone.files_dropped.connect(self.add_files)
        self.drops = FileDropFilter(self)  # a drop that misses the box still counts
        self.drops.watch(self, self.table, self.answer_view)
        self.drops.files_dropped.connect(self.add_files)
        self.cancel_button.clicked.connect(self.cancel)
        self.remove_button.clicked.connect(self.remove_selected)
        self.clear_button.clicked.connect(self.remove_all)
        self.ask_button.clicked.connect(self.ask)
        self.question.returnPressed.connect(self.ask)
        self.stop_button.clicked.connect(self.session.stop)
        self.sources.currentRowChanged.connect(self.show_excerpt)
        self.answer_view.anchorClicked.connect(self._on_link)
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._update_buttons())
        self._show_progress(None)
        self._show_error(None)

    @property
    def ingesting(self) -> bool:
        return self._ingesting is not None

    @property
    def busy(self) -> bool:
        return self._answering or self.session.busy

    # -- documents ------------------------------------------------------------------------------
    def add_files(self, paths: list[Path]) -> None:
        """Read and embed the files (dropped or opened); one batch at a time."""
        if self.ingesting:
            self._show_error("Files are still being read: wait for them, or cancel.")
            return
        self._show_error(None)
        names = ", ".join(path.name for path in paths)
        self._show_progress(Progress(0, None, f"Reading {names}…"))
        documents = self.session.documents
        self._ingesting = self.worker.submit(
            lambda ctx: documents.ingest(paths, progress=ctx.report, cancel=lambda: ctx.token.cancelled),
            on_done=self._on_ingested, on_progress=self._show_progress, owner=self)
        self._update_buttons()

    def cancel_ingest(self) -> None:
        if self._ingesting is not None:
            self._ingesting.cancel()

    def cancel(self) -> None:
        """The progress row's Cancel: files being read, or pages being read by a vision model."""
        if self._ingesting is not None:
            self.cancel_ingest()
        elif self._answering:
            self.session.stop()

    def remove_selected(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        if rows and not self.ingesting:
            self.session.documents.remove(self.documents.item(rows[0].row(), 0).data(Qt.ItemDataRole.UserRole))
            self.refresh_documents()

    def remove_all(self) -> None:
        if not self.ingesting:
            self.session.documents.clear()
            self.refresh_documents()

    def refresh_documents(self) -> None:
        self.documents.removeRows(0, self.documents.rowCount())
        for document in self.session.documents.documents:
            name = QStandardItem(document.name)
            name.setData(str(document.path), Qt.ItemDataRole.UserRole)
            name.setToolTip(str(document.path))
            contents = QStandardItem(document.describe())
            contents.setToolTip(document.describe())
            self.documents.appendRow([name, QStandardItem(KIND_NAMES.get(document.kind, document.kind)),
                                      contents, QStandardItem(str(document.chunks))])
        self._show_vision_notice()
        # Qt sizes "resize to contents" columns when the view is laid out, not when rows arrive later
        for column in (0, 1, 3):
            self.table.resizeColumnToContents(column)
        self.table.setColumnWidth(0, min(self.table.columnWidth(0), MAX_NAME_WIDTH))
        self._update_buttons()

    def _on_ingested(self, result: TaskResult[IngestReport]) -> None:
        self._ingesting = None
        self._show_progress(None)
        report = result.value
        if result.cancelled:
            self.progress_label.setText("Cancelled: nothing was added.")
            self.progress_label.show()
        elif result.error is not None or report is None:
            self._show_error(f"The documents could not be read: {result.error_message}")
        else:
            self._show_error("\n".join(failure.message for failure in report.failed) or None)
            if report.added:
                added = "; ".join(f"{d.name} ({d.describe()}, {d.chunks} excerpts)" for d in report.added)
                self.progress_label.setText(f"Added {added}")
                self.progress_label.show()
        self.refresh_documents()
        self.ingest_finished.emit(result)

    # -- questions ------------------------------------------------------------------------------
    def ask(self) -> None:
        question = self.question.text().strip()
        if not question or self.busy or not self.ask_button.isEnabled():
            return
        self._show_error(None)
        self._answering = True
        self.answer = None
        self.answer_view.clear()
        self.sources.clear()
        self.excerpt.clear()
        self.excerpt_title.setText("The passages of this answer appear here.")  # nothing of the last one stays
        self.worker.spawn(self.session.ask(question, on_start=self._on_start, on_delta=self._on_delta,
                                           on_progress=self._on_page_progress),
                          on_done=self._on_answer, owner=self)
        self._update_buttons()

    def _on_start(self, citations: list[Citation]) -> None:
        self.citations = citations
        for citation in citations:
            how = "page image" if citation.image else f"similarity {citation.hit.score:.2f}"
            item = QListWidgetItem(f"{citation.label}   ({how})")
            item.setToolTip(citation.text[:400])
            self.sources.addItem(item)
        self.show_excerpt(0)  # the viewer follows the answer being given

    def _on_page_progress(self, done: int, total: int, message: str) -> None:
        self._reading_pages = True
        self._show_progress(Progress(done, total, message))
        self.cancel_button.setEnabled(True)

    def _on_delta(self, text: str) -> None:
        self.answer_view.moveCursor(QTextCursor.MoveOperation.End)
        self.answer_view.insertPlainText(text)

    def _on_answer(self, result: TaskResult[DocAnswer]) -> None:
        self._answering = False
        if self._reading_pages and not self.ingesting:  # the pages' progress; an ingest keeps its own
            self._show_progress(None)
        self._reading_pages = False
        answer = result.value
        if result.error is not None:
            self._show_error(result.error_message)
        elif answer is not None:
            self.answer = answer
            self._render_answer(answer)
            if answer.cited:  # the first passage the answer cites
                self.show_excerpt(answer.cited[0].number - 1)
            if answer.status == "error":
                self._show_error(f"The answer failed: {answer.error}")
        self._update_buttons()
        self.answer_finished.emit(result)

    def _render_answer(self, answer: DocAnswer) -> None:
        """The finished answer with each [n] a link to its passage, and the sources it cited under it."""
        body = _CITE.sub(lambda m: _cite_links(m.group(1), len(answer.citations)), html.escape(answer.text))
        notes = {"stopped": " (stopped)", "error": " (failed)"}
        parts = [f"<p>{body.replace(chr(10), '<br>')}<i>{notes.get(answer.status, '')}</i></p>"]
        cited = answer.cited or answer.citations  # an answer citing nothing still came from these excerpts
        heading = "Sources" if answer.cited else "Excerpts given to the model (the answer cites none)"
        parts.append(f"<p><b>{heading}</b><br>" + "<br>".join(
            f'<a href="cite:{c.number}">{html.escape(c.label)}</a>' for c in cited) + "</p>")
        self.answer_view.setHtml("".join(parts))

    def show_excerpt(self, row: int) -> None:
        """Show the passage behind source [row + 1]."""
        if not 0 <= row < len(self.citations):
            return
        citation = self.citations[row]
        self.excerpt_title.setText(f"<b>{html.escape(citation.label)}</b>")
        self.excerpt.setPlainText(citation.text if citation.text or not citation.image
                                  else "This page has no text layer: the model read its image.")
        if self.sources.currentRow() != row:
            self.sources.setCurrentRow(row)

    def _on_link(self, url: QUrl) -> None:
        if url.scheme() == "cite" and url.path().isdigit():
            self.show_excerpt(int(url.path()) - 1)

    # -- state ----------------------------------------------------------------------------------
    def _on_runtime(self, status: RuntimeStatus) -> None:
        if status.state == "unloading":
            self.session.stop()
        if not status.ready:
            self.mode.setText("No model is loaded: documents can be added now; load a model in the Models "
                              "pane to ask questions.")
        elif self.session.supports_vision:
            self.mode.setText(f"{status.model} reads images: PDF pages go to it as images, page by page; "
                              "other documents as their extracted text.")
        else:
            self.mode.setText(f"{status.model} reads text only, so the documents' extracted text is used "
                              "(pages are not sent as images).")
        if self.session.documents.ocr.notice:
            self.mode.setText(f"{self.mode.text()} {self.session.documents.ocr.notice}")
        self._show_vision_notice()
        self._update_buttons()

    def _show_vision_notice(self) -> None:
        """Scanned PDFs in the set and no vision model: say that one is needed, and how to get it."""
        scanned = self.session.documents.scanned
        needed = bool(scanned) and not self.session.supports_vision
        self.vision_notice.setText(needs_vision_message(scanned) if needed else "")
        self.vision_notice.setVisible(needed)

    def _update_buttons(self) -> None:
        busy, ingesting = self.busy, self.ingesting
        has_documents = self.documents.rowCount() > 0
        self.ask_button.setEnabled(self.runtime.status.ready and has_documents and not busy)
        self.stop_button.setEnabled(busy)
        self.cancel_button.setEnabled(ingesting or busy)
        self.remove_button.setEnabled(not ingesting and self.table.selectionModel().hasSelection())
        self.clear_button.setEnabled(not ingesting and has_documents)

    def _show_progress(self, progress: Progress | None) -> None:
        show_progress(self.progress, self.progress_label, self.cancel_button, progress)

    def _show_error(self, text: str | None) -> None:
        show_error(self.error, text)

    def shutdown(self) -> None:
        self.cancel_ingest()
        self.session.stop()


def _cite_links(numbers: str, count: int) -> str:
    links = [f'<a href="cite:{n}">{n}</a>' if 0 < int(n) <= count else n
             for n in (part.strip() for part in numbers.split(","))]
    return "[" + ", ".join(links) + "]"


def _heading(text: str) -> QLabel:
    return QLabel(f"<b>{text}</b>")


def _column(*widgets: QWidget) -> QWidget:
    holder = QWidget()
    layout = QVBoxLayout(holder)
    layout.setContentsMargins(0, 0, 0, 0)
    for widget in widgets:
        layout.addWidget(widget)
    return holder
