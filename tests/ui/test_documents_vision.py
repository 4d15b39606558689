"""The Documents pane with a vision model: PDFs dropped on the real pane, questions asked with its
Ask button, and the tiny random-weight Gemma 3 vision model of tests/fixtures/vision behind it,
recording every request (its images) it is sent. A text-only model (the API tests' fake engine)
keeps the text path, and a scanned PDF then says a vision model is needed and how to get one."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt, QUrl
from server.fakes import FakeEngine
from studio.doc_files import PAGES, write_docx, write_pdf, write_scanned_pdf

from app.studio.documents import render_pages
from app.studio.page_qa import page_scale

from .test_documents_pane import WAIT_MS, ask, ingest, rows

MODEL = Path(__file__).parents[1] / "fixtures" / "vision" / "gemma3" / "hf"


@pytest.fixture(scope="module")
def tiny_vision():
    """The tiny vision model's LLMEngine, loaded once; each test wraps it in its own AsyncEngine."""
    from app.engine import EngineConfig
    from app.engine.core.engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(MODEL), device="cpu", max_model_len=512, block_size=4))


@pytest.fixture
def vision_engine(tiny_vision):
    """An AsyncEngine over the tiny vision model that keeps every GenerationRequest it is given."""
    from app.engine import AsyncEngine

    client = AsyncEngine(engine=tiny_vision)
    client.sent = []
    generate = client.generate
    client.generate = lambda request: client.sent.append(request) or generate(request)
    yield client
    client.close()


def expected_views(client, pdf: Path) -> list[list]:
    """Each page rendered at the model's resolution and prepared as the tower takes it: its image views."""
    views = []
    for page in render_pages(pdf, dpi=page_scale(client)):
        buffer = io.BytesIO()
        page.save(buffer, "PNG")
        views.append(list(client.vision.prepare(buffer.getvalue()).views))
    return views


def image_requests(client) -> list:
    return [request for request in client.sent if request.images]


def test_both_pages_of_a_dropped_pdf_reach_the_model_as_images(qtbot, make_window, tmp_path, vision_engine):
    window = make_window(panes=("documents",), engine=vision_engine)
    pane = window.pane("documents")
    assert "reads images: PDF pages go to it as images" in pane.mode.text()
    pdf = write_pdf(tmp_path / "two.pdf", PAGES[:2])
    ingest(qtbot, pane, [pdf])
    progress: list[str] = []
    original = pane._on_page_progress
    pane._on_page_progress = lambda done, total, message: progress.append(message) or original(done, total, message)
    result = ask(qtbot, pane, "How much do tickets cost?")
    answer = result.value
    assert result.ok and answer.status == "complete", result.error_message
    sent = image_requests(vision_engine)
    assert len(sent) == len(vision_engine.sent) == 2  # one request per page, nothing as text
    for request, views in zip(sent, expected_views(vision_engine, pdf), strict=True):
        assert [v.key for v in request.images] == [v.key for v in views]
        np.testing.assert_array_equal(request.images[0].pixel_values, views[0].pixel_values)
        tokens = request.prompt_token_ids.count(vision_engine.vision.image_token_id)
        assert tokens == len(request.images) * vision_engine.vision.tokens_per_image
    assert sent[0].images[0].key != sent[1].images[0].key
    assert progress == ["Reading page 1 of two.pdf (1 of 2)…", "Reading page 2 of two.pdf (2 of 2)…"]
    assert pane.progress.isHidden() and pane.cancel_button.isHidden()  # gone with the answer
    # the answer is each page's reply under its citation, and both pages are its sources
    assert answer.text.startswith("[1] ") and "\n\n[2] " in answer.text
    assert [c.label for c in answer.cited] == ["[1] two.pdf, page 1", "[2] two.pdf, page 2"]
    assert [pane.sources.item(i).text() for i in range(pane.sources.count())] == [
        "[1] two.pdf, page 1   (page image)", "[2] two.pdf, page 2   (page image)"]
    assert "Sources\n[1] two.pdf, page 1\n[2] two.pdf, page 2" in pane.answer_view.toPlainText()
    pane.answer_view.anchorClicked.emit(QUrl("cite:2"))
    assert pane.excerpt_title.text() == "<b>[2] two.pdf, page 2</b>"
    assert pane.excerpt.toPlainText() == PAGES[1].replace(". ", ".\n")  # the page's text (as excerpts show it)
    assert answer.prompt_tokens == sum(len(r.prompt_token_ids) for r in sent)


def test_a_scanned_pdf_is_read_from_its_page_images(qtbot, make_window, tmp_path, vision_engine):
    window = make_window(panes=("documents",), engine=vision_engine)
    pane = window.pane("documents")
    scan = write_scanned_pdf(tmp_path / "scan.pdf")
    result = ingest(qtbot, pane, [scan])
    assert result.ok and not result.value.failed
    assert rows(pane) == [["scan.pdf", "PDF", "2 pages, scanned (no text layer)", "0"]]
    assert pane.vision_notice.isHidden() and pane.error.isHidden()
    answer = ask(qtbot, pane, "What does the report say?").value
    assert answer.status == "complete"
    sent = image_requests(vision_engine)
    assert [[v.key for v in r.images] for r in sent] == [
        [v.key for v in views] for views in expected_views(vision_engine, scan)]
    pane.sources.setCurrentRow(0)
    assert pane.excerpt.toPlainText() == "This page has no text layer: the model read its image."


def test_other_documents_follow_the_pages_as_text_numbered_after_them(qtbot, make_window, tmp_path,
                                                                       vision_engine):
    window = make_window(panes=("documents",), engine=vision_engine)
    pane = window.pane("documents")
    ingest(qtbot, pane, [write_pdf(tmp_path / "two.pdf", PAGES[:2]), write_docx(tmp_path / "travel.docx")])
    answer = ask(qtbot, pane, "How does the team travel to Lyon?").value
    assert answer.status == "complete"
    pages, text = vision_engine.sent[:2], vision_engine.sent[2:]
    assert all(r.images for r in pages) and len(text) == 1 and not text[0].images
    prompt = vision_engine.tokenizer.decode(text[0].prompt_token_ids)
    assert "[3] travel.docx, section Travel\nThe team travels to Lyon by train." in prompt
    assert "two.pdf" not in prompt  # the PDF went as pages, not again as text
    labels = [c.label for c in answer.citations]
    assert labels[:2] == ["[1] two.pdf, page 1", "[2] two.pdf, page 2"] and labels[2] == "[3] travel.docx, section Travel"
    assert [c.image for c in answer.citations] == [True, True] + [False] * (len(labels) - 2)


def test_cancel_stops_between_pages(qtbot, make_window, tmp_path, vision_engine):
    window = make_window(panes=("documents",), engine=vision_engine)
    pane = window.pane("documents")
    ingest(qtbot, pane, [write_pdf(tmp_path / "three.pdf")])
    generate = vision_engine.generate

    def cancel_at_the_second_page(request):
        if len(vision_engine.sent) == 1:
            assert not pane.cancel_button.isHidden() and pane.cancel_button.isEnabled()
            qtbot.mouseClick(pane.cancel_button, Qt.MouseButton.LeftButton)
        return generate(request)

    vision_engine.generate = cancel_at_the_second_page
    answer = ask(qtbot, pane, "Price?").value
    assert answer.status == "stopped", answer.error
    assert answer.text.startswith("[1] ") and "[2]" not in answer.text  # the second page was cut off unanswered
    assert len(vision_engine.sent) == 2 and pane.progress.isHidden() and pane.ask_button.isEnabled()


def test_a_scanned_pdf_and_a_text_only_model_say_a_vision_model_is_needed(qtbot, make_window, tmp_path):
    engine = FakeEngine(context_length=4096)
    window = make_window(panes=("documents",), engine=engine)
    pane = window.pane("documents")
    ingest(qtbot, pane, [write_scanned_pdf(tmp_path / "scan.pdf")])
    assert pane.mode.text() == ("fake-model reads text only, so the documents' extracted text is used (pages are "
                                "not sent as images).")
    notice = pane.vision_notice.text()
    assert not pane.vision_notice.isHidden()
    assert notice.startswith("scan.pdf has no text layer (scanned pages): a vision model is needed to read them.")
    assert "Models pane" in notice and "mmproj" in notice
    assert pane.error.isHidden()  # a notice, not an error
    result = ask(qtbot, pane, "What does the report say?")
    assert result.error is not None and pane.error.text() == notice
    assert engine.requests == []  # nothing was sent
    # a PDF with text beside it: the text path answers, and the notice stays for the scan
    ingest(qtbot, pane, [write_pdf(tmp_path / "festival.pdf")])
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as outcome:
        pane.question.setText("How much do pears cost?")
        qtbot.mouseClick(pane.ask_button, Qt.MouseButton.LeftButton)
    assert outcome.args[0].value.status == "complete"
    assert all(not c.image for c in outcome.args[0].value.citations)
    assert not pane.vision_notice.isHidden()
