"""Scanned PDFs in the chat. With the tiny random-weight Gemma 3 vision model of tests/fixtures/vision
loaded, a scanned PDF attached with the Attach button or dropped on the chat goes with the next
message as its pages' images, rendered at the model's resolution as the Documents pane renders them
(the pixels the model receives are checked against that rendering), at most MAX_CHAT_PAGES with a
sentence saying so. With a text-only model (the API tests' fake engine) the chat says, in the
Documents pane's own words, that a vision model is needed and how to get one."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from server.fakes import FakeEngine
from studio.doc_files import write_scanned_pdf

from app.studio.attachments import MAX_CHAT_PAGES

from .drag import drop
from .test_chat_attach import WAIT_MS, _attach, _send
from .test_documents_pane import ingest
from .test_documents_vision import expected_views, tiny_vision, vision_engine  # noqa: F401 - fixtures

PAGE_NAMES = ["scan.pdf, page 1", "scan.pdf, page 2"]


def _chat(make_window, engine, panes=("chat",)):
    window = make_window(panes=panes, engine=engine)
    pane = window.pane("chat")
    pane.sampling.boxes["max_tokens"].setValue(2)
    return window, pane


def _assert_sent_as_pages(client, request, pdf, count: int) -> None:
    """`request` carries the PDF's first `count` pages as the model's image inputs, each page's pixels
    as rendered at the model's resolution and prepared by its processor, and their image tokens."""
    pages = expected_views(client, pdf)[:count]
    assert [v.key for v in request.images] == [v.key for views in pages for v in views]
    for sent, view in zip(request.images, [v for views in pages for v in views], strict=True):
        np.testing.assert_array_equal(sent.pixel_values, view.pixel_values)
    tokens = request.prompt_token_ids.count(client.vision.image_token_id)
    assert tokens == len(request.images) * client.vision.tokens_per_image


def test_an_attached_scanned_pdf_goes_as_its_page_images(qtbot, make_window, tmp_path, vision_engine):  # noqa: F811
    _window, pane = _chat(make_window, vision_engine)
    scan = write_scanned_pdf(tmp_path / "scan.pdf")
    assert _attach(qtbot, pane, [scan]).ok
    assert [a.name for a in pane.tray.pending] == PAGE_NAMES and all(a.kind == "image" for a in pane.tray.pending)
    assert pane.error.isHidden()
    assert pane.tray.tiles.item(0).data(Qt.ItemDataRole.UserRole) is True  # each page shows as a thumbnail
    assert _send(qtbot, pane, "What does the report say?").ok
    _assert_sent_as_pages(vision_engine, vision_engine.sent[-1], scan, 2)
    assert f"Image: {PAGE_NAMES[0]} · Image: {PAGE_NAMES[1]}" in pane.transcript.toPlainText()


def test_a_dropped_scanned_pdf_goes_as_pages_and_a_text_file_is_searched(qtbot, make_window, tmp_path,
                                                                         vision_engine):  # noqa: F811
    _window, pane = _chat(make_window, vision_engine)
    scan, text = write_scanned_pdf(tmp_path / "scan.pdf"), tmp_path / "prices.txt"
    text.write_text("Tickets cost twelve euros.")  # short: its excerpt and two pages fit the tiny model's 512
    with qtbot.waitSignals([pane.attach_finished, pane.files_read], timeout=WAIT_MS):
        drop(pane.transcript, [scan, text])
    assert [d.name for d in pane.documents.documents] == ["prices.txt"]  # searched and cited, as before
    assert [a.name for a in pane.tray.pending] == PAGE_NAMES and pane.error.isHidden()
    assert "prices.txt" in pane.attachments.text() and "scan.pdf" not in pane.attachments.text()
    assert _send(qtbot, pane, "How much do tickets cost?").ok
    _assert_sent_as_pages(vision_engine, vision_engine.sent[-1], scan, 2)


def test_a_long_scanned_pdf_sends_its_first_pages_and_says_so(qtbot, make_window, tmp_path,
                                                              vision_engine):  # noqa: F811
    _window, pane = _chat(make_window, vision_engine)
    pages = [f"Page {n} of the long report." for n in range(1, MAX_CHAT_PAGES + 3)]
    scan = write_scanned_pdf(tmp_path / "long.pdf", pages)
    assert _attach(qtbot, pane, [scan]).ok
    assert [a.name for a in pane.tray.pending] == [f"long.pdf, page {n}" for n in range(1, MAX_CHAT_PAGES + 1)]
    assert pane.error.text() == (f"long.pdf has {len(pages)} pages: only pages 1-{MAX_CHAT_PAGES} go with your "
                                 f"message as images (at most {MAX_CHAT_PAGES} pages per message). Ask about the "
                                 "rest in the Documents pane.")
    # the first pages as the model's processor sees them (eight pages overflow the tiny model's 512 tokens,
    # which the chat refuses with both numbers: the two-page tests above send theirs)
    prepared = [[v.key for v in vision_engine.vision.prepare(a.data).views] for a in pane.tray.pending]
    assert prepared == [[v.key for v in views] for views in expected_views(vision_engine, scan)[:MAX_CHAT_PAGES]]


def test_a_text_only_model_is_told_a_vision_model_is_needed_as_the_documents_pane_says(qtbot, make_window,
                                                                                     tmp_path):
    engine = FakeEngine(context_length=4096)
    window, pane = _chat(make_window, engine, panes=("chat", "documents"))
    scan = write_scanned_pdf(tmp_path / "scan.pdf")
    documents = window.pane("documents")
    ingest(qtbot, documents, [scan])
    notice = documents.vision_notice.text()  # the Documents pane's own notice for the same file
    assert notice.startswith("scan.pdf has no text layer (scanned pages): a vision model is needed")

    with qtbot.waitSignal(pane.attach_finished, timeout=WAIT_MS):
        drop(pane.transcript, [scan])
    assert pane.error.text() == notice and not pane.error.isHidden()
    assert pane.documents.documents == [] and pane.tray.pending == []  # nothing kept that cannot be read
    pane._show_error(None)
    assert _attach(qtbot, pane, [scan]).ok
    assert pane.error.text() == notice and pane.tray.pending == []
    assert engine.requests == []  # nothing was sent
