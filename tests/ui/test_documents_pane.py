"""The Documents pane and documents dropped on the Chat: real drops of files written here, the real MiniLM
embedder, and a fake engine that answers with the citations its prompt carried (one test runs the
embedded Gemma 3 270M instead)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt, QUrl
from server import fakes
from server.fakes import FakeEngine
from studio.doc_files import PAGES, write_docx, write_pdf

from app.studio.doc_qa import DocQASession, DocumentSet
from app.studio.tasks import ThreadExecutor
from app.ui.panes.documents import DocumentsPane
from app.ui.workers import UiBridge, Worker

from .drag import drop

WAIT_MS = 20_000
REAL_MODEL_WAIT_MS = 300_000  # the embedded model on shared CPUs
def write_xlsx(path: Path) -> Path:
    import openpyxl

    workbook = openpyxl.Workbook()
    workbook.active.title = "Budget"
    workbook.active.append(("Stage", 1200))
    workbook.create_sheet("Staff").append(("Ada", "Sound engineer"))
    workbook.save(str(path))
    return path


def citing_answer(prompt: str) -> str:
    """The fake model's answer: the first excerpt's citation and opening words, and the other numbers."""
    excerpts = re.findall(r"^\[(\d+)\] (.+?)\n(.+)$", prompt, re.MULTILINE)
    if not excerpts:
        return "No excerpts."
    number, citation, text = excerpts[0]
    return f"[{number}] {citation} says: {text[:60]} See also " + ", ".join(f"[{n}]" for n, *_ in excerpts[1:])


@pytest.fixture
def citing_engine(monkeypatch) -> FakeEngine:
    monkeypatch.setattr(fakes, "scripted_answer", citing_answer)
    return FakeEngine(context_length=4096)


def rows(pane: DocumentsPane) -> list[list[str]]:
    model = pane.documents
    return [[model.item(r, c).text() for c in range(model.columnCount())] for r in range(model.rowCount())]


def ingest(qtbot, pane: DocumentsPane, paths: list[Path], wait_ms: int = WAIT_MS):
    with qtbot.waitSignal(pane.ingest_finished, timeout=wait_ms) as outcome:
        drop(pane.drop_zone, paths)
    return outcome.args[0]


def ask(qtbot, pane: DocumentsPane, question: str, wait_ms: int = WAIT_MS):
    pane.question.setText(question)
    with qtbot.waitSignal(pane.answer_finished, timeout=wait_ms) as outcome:
        qtbot.mouseClick(pane.ask_button, Qt.MouseButton.LeftButton)
    return outcome.args[0]


def test_dropped_files_are_listed_with_their_pages_sheets_and_sections(qtbot, make_window, tmp_path):
    window = make_window(panes=("documents",))
    pane = window.pane("documents")
    assert not pane.ask_button.isEnabled()  # nothing to ask about yet
    files = [write_pdf(tmp_path / "festival.pdf"), write_docx(tmp_path / "travel.docx"),
             write_xlsx(tmp_path / "budget.xlsx")]
    result = ingest(qtbot, pane, files)
    assert result.ok and not result.value.failed
    assert rows(pane) == [["festival.pdf", "PDF", "3 pages", "3"], ["travel.docx", "Word", "2 sections", "2"],
                          ["budget.xlsx", "Excel", "2 sheets: Budget, Staff", "2"]]
    assert pane.progress_label.text().startswith("Added festival.pdf (3 pages, 3 excerpts)")
    assert pane.progress.isHidden() and pane.error.isHidden()
    assert pane.ask_button.isEnabled()  # the fake model is loaded
    assert "fake-model reads text only" in pane.mode.text() and "not sent as images" in pane.mode.text()
    pane.table.selectRow(1)
    qtbot.mouseClick(pane.remove_button, Qt.MouseButton.LeftButton)
    assert [row[0] for row in rows(pane)] == ["festival.pdf", "budget.xlsx"]


def test_an_answer_streams_cites_the_page_and_its_sources_open(qtbot, make_window, tmp_path, citing_engine):
    window = make_window(panes=("documents",), engine=citing_engine)
    pane = window.pane("documents")
    ingest(qtbot, pane, [write_pdf(tmp_path / "festival.pdf")])
    seen: list[str] = []
    pane.answer_view.textChanged.connect(lambda: seen.append(pane.answer_view.toPlainText()))
    result = ask(qtbot, pane, "How much do pears cost?")
    answer = result.value
    assert result.ok and answer.status == "complete"
    assert answer.text.startswith("[1] festival.pdf, page 3 says: Pears cost four dollars")
    assert len([s for s in seen if s and len(s) < len(answer.text)]) >= 5  # it arrived piece by piece
    shown = pane.answer_view.toPlainText()
    assert "[1] festival.pdf, page 3 says" in shown and "Sources\n[1] festival.pdf, page 3" in shown
    assert pane.sources.item(0).text().startswith("[1] festival.pdf, page 3")
    assert pane.sources.count() == len(answer.citations) == 2  # the third page is below the relevance floor
    assert all(c.hit.score >= pane.session.documents.min_relevance for c in answer.citations)
    pane.sources.setCurrentRow(1)  # a click on the second source shows its passage
    assert pane.excerpt_title.text() == f"<b>{answer.citations[1].label}</b>"
    assert pane.excerpt.toPlainText() == answer.citations[1].text
    pane.answer_view.anchorClicked.emit(QUrl("cite:1"))  # the [1] link in the answer
    assert pane.excerpt_title.text() == "<b>[1] festival.pdf, page 3</b>"
    assert pane.excerpt.toPlainText() == PAGES[2]


def test_a_corrupt_pdf_shows_the_reason_not_a_traceback(qtbot, make_window, tmp_path):
    window = make_window(panes=("documents",))
    pane = window.pane("documents")
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nthis is not really a PDF\n")
    result = ingest(qtbot, pane, [broken, write_pdf(tmp_path / "festival.pdf")])
    assert result.ok
    assert not pane.error.isHidden()
    assert pane.error.text().startswith("broken.pdf: the PDF is corrupt or unreadable")
    assert "Traceback" not in pane.error.text()
    assert [row[0] for row in rows(pane)] == ["festival.pdf"]  # the good file still went in
    unknown = tmp_path / "song.flac"
    unknown.write_bytes(b"fLaC not a document")
    with qtbot.waitSignal(pane.ingest_finished, timeout=WAIT_MS):
        drop(pane.table, [unknown])  # beside the box: the whole pane takes files
    assert pane.error.text().startswith("song.flac: unknown format '.flac'")


def test_the_open_button_takes_files_from_the_dialog(qtbot, make_window, tmp_path):
    window = make_window(panes=("documents",))
    pane = window.pane("documents")
    path = write_docx(tmp_path / "travel.docx")
    pane.drop_zone.chooser = lambda parent, title, filters, multiple: [str(path)]
    with qtbot.waitSignal(pane.ingest_finished, timeout=WAIT_MS):
        qtbot.mouseClick(pane.drop_zone.open_button, Qt.MouseButton.LeftButton)
    assert rows(pane) == [["travel.docx", "Word", "2 sections", "2"]]


class GatedEmbedder:
    """The real embedder, held at each batch until the test opens the gate."""

    def __init__(self) -> None:
        from app.engine.embeddings import load_default_embedder

        self.inner = load_default_embedder()
        self.model_name, self.dimensions, self.max_tokens = "gated", self.inner.dimensions, self.inner.max_tokens
        self.waiting = threading.Event()
        self.gate = threading.Event()

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def embed(self, texts: list[str]) -> np.ndarray:
        self.waiting.set()
        self.gate.wait(10)
        return self.inner.embed(texts)


def test_cancel_stops_ingestion_and_adds_nothing(qtbot, make_context, tmp_path):
    context = make_context(FakeEngine())
    embedder = GatedEmbedder()
    worker = Worker(UiBridge(), ThreadExecutor(max_workers=1))
    pane = DocumentsPane(DocQASession(DocumentSet(lambda: embedder, top_k=2), lambda: context.host.client),
                         context.runtime, worker)
    qtbot.addWidget(pane)
    pane.show()
    pdf = write_pdf(tmp_path / "festival.pdf")
    with qtbot.waitSignal(pane.ingest_finished, timeout=WAIT_MS) as outcome:
        drop(pane.drop_zone, [pdf])
        qtbot.waitUntil(embedder.waiting.is_set, timeout=WAIT_MS)
        qtbot.waitUntil(pane.progress.isVisible, timeout=WAIT_MS)
        assert pane.cancel_button.isEnabled()
        qtbot.mouseClick(pane.cancel_button, Qt.MouseButton.LeftButton)
        embedder.gate.set()
    assert outcome.args[0].cancelled
    assert rows(pane) == [] and pane.progress_label.text() == "Cancelled: nothing was added."
    assert not pane.progress.isVisible()
    worker.shutdown()


def test_a_document_dropped_on_the_chat_is_cited_by_the_next_answer(qtbot, make_window, tmp_path, citing_engine):
    window = make_window(panes=("chat",), engine=citing_engine)
    pane = window.pane("chat")
    with qtbot.waitSignal(pane.attach_finished, timeout=WAIT_MS) as attached:
        drop(pane.input, [write_pdf(tmp_path / "festival.pdf")])  # onto the message box, not into it
    assert attached.args[0].ok and pane.input.toPlainText() == ""
    assert pane.attachments.text() == "Attached: festival.pdf (3 pages). Answers cite them."
    pane.input.setPlainText("How much do pears cost?")
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as outcome:
        qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
    answer = outcome.args[0].value
    assert answer.status == "complete"
    assert answer.text.startswith("[1] festival.pdf, page 3 says: Pears cost four dollars")
    [conversation] = window.context.history.conversations()
    assert conversation.title.startswith("How much do pears cost?")
    question = window.context.history.conversation(conversation.id).messages[0].content
    assert "[1] festival.pdf, page 3\nPears cost four dollars" in question
    assert "[1] festival.pdf, page 3 says" in pane.transcript.toPlainText()
    audio = tmp_path / "speech.wav"
    audio.write_bytes(b"RIFF")
    drop(pane.transcript, [audio])  # audio belongs to the Transcribe pane
    assert "speech.wav: only PDF, Word, Excel" in pane.error.text()
    qtbot.mouseClick(pane.detach_button, Qt.MouseButton.LeftButton)
    assert len(pane.documents) == 0 and pane.detach_button.isHidden()


def test_the_embedded_model_answers_from_a_dropped_pdf_with_a_citation(qtbot, make_window, make_context,
                                                                       real_engine, tmp_path):
    window = make_window(make_context(real_engine, threaded=True), panes=("documents",))
    pane = window.pane("documents")
    pane.session.max_tokens = 16
    ingest(qtbot, pane, [write_pdf(tmp_path / "festival.pdf")])
    result = ask(qtbot, pane, "Where does the festival take place?", wait_ms=REAL_MODEL_WAIT_MS)
    answer = result.value
    assert result.ok and answer.status == "complete", result.error_message
    assert answer.citations[0].label == "[1] festival.pdf, page 1"
    assert answer.text.startswith("According to [1]") and "Lyon" in answer.text
    assert answer.cited[0].label == "[1] festival.pdf, page 1"
    assert "Sources\n[1] festival.pdf, page 1" in pane.answer_view.toPlainText()
    assert "gemma-3-270m-q4_k_m reads text only" in pane.mode.text()



def test_a_document_set_is_back_after_a_restart(qtbot, make_window, make_context, tmp_path, citing_engine):
    first = make_window(make_context(citing_engine), panes=("documents",))
    ingest(qtbot, first.pane("documents"), [write_pdf(tmp_path / "festival.pdf")])
    listed = rows(first.pane("documents"))
    first.close()

    pane = make_window(make_context(citing_engine), panes=("documents",)).pane("documents")
    assert rows(pane) == listed and listed[0][0] == "festival.pdf"
    result = ask(qtbot, pane, "How much do pears cost?")
    assert result.ok and result.value.citations[0].text == PAGES[2]  # searched with the kept vectors


def test_the_passage_viewer_follows_the_current_answer(qtbot, make_window, tmp_path, citing_engine):
    pane = make_window(panes=("documents",), engine=citing_engine).pane("documents")
    ingest(qtbot, pane, [write_pdf(tmp_path / "festival.pdf")])
    first = ask(qtbot, pane, "How much do pears cost?").value
    assert pane.excerpt.toPlainText() == first.cited[0].text
    second = ask(qtbot, pane, "When does the festival open?").value
    assert second.citations[0].text != first.cited[0].text
    assert pane.excerpt_title.text() == f"<b>{second.cited[0].label}</b>"
    assert pane.excerpt.toPlainText() == second.cited[0].text and pane.sources.currentRow() == 0
