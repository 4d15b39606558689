"""The Documents pane with an OCR model: PDFs dropped on the real pane while the tiny random-weight
PaddleOCR-VL of tests/fixtures/vision/paddleocr_vl is the documents.ocr_model, behind the Studio's
OcrHost. Pages without a text layer are rendered and read by it (its reply is the page's indexed text,
cited by page); pages with a text layer keep their own text and never reach it. The chat model is the
API tests' fake engine, answering with the first excerpt's citation."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from studio.doc_files import PAGES, write_scanned_pdf

from app.engine.tasks.ocr import PageReader
from app.studio.documents import render_pages
from app.studio.ocr import OcrHost, page_scale

from .test_documents_pane import ask, citing_engine, ingest, rows  # noqa: F401 (a fixture)

MODEL = Path(__file__).parents[1] / "fixtures" / "vision" / "paddleocr_vl" / "hf"
OCR_WAIT_MS = 120_000


@pytest.fixture(scope="module")
def tiny_reader() -> PageReader:
    """The tiny PaddleOCR-VL as a page reader (a short reply: its random weights rarely stop)."""
    return PageReader.load(MODEL, device="cpu", max_reply_tokens=12)


@pytest.fixture
def reader(tiny_reader):
    """The reader, recording the page images it is given."""
    tiny_reader.pages = []
    read = type(tiny_reader).read
    tiny_reader.read = lambda data, **kw: tiny_reader.pages.append(data) or read(tiny_reader, data, **kw)
    yield tiny_reader
    del tiny_reader.read


def write_mixed_pdf(path: Path, tmp: Path) -> Path:
    """Page 1 typed text (a text layer), page 2 a picture of text (a scan: none)."""
    from fpdf import FPDF
    from PIL import Image, ImageDraw

    picture = Image.new("RGB", (400, 160), "white")
    ImageDraw.Draw(picture).text((20, 20), "Receipt 77: two pears", fill="black")
    picture.save(tmp / "picture.png")
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    pdf.add_page()
    pdf.multi_cell(w=0, text=PAGES[0])
    pdf.add_page()
    pdf.image(str(tmp / "picture.png"), x=10, y=10, w=150)
    pdf.output(str(path))
    return path


def expected_text(reader: PageReader, pdf: Path, page: int) -> str:
    """What the OCR model reads on one page rendered as the Studio renders it."""
    (image,) = render_pages(pdf, dpi=page_scale(reader), pages=[page])
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return type(reader).read(reader, buffer.getvalue())


def test_scanned_pages_are_read_by_the_ocr_model_and_cited_by_page(qtbot, make_window, tmp_path, reader,
                                                                   citing_engine):  # noqa: F811
    window = make_window(panes=("documents",), engine=citing_engine,
                         ocr=OcrHost(lambda: reader, "PaddleOCR-VL"))
    pane = window.pane("documents")
    assert "read by PaddleOCR-VL (OCR) as they are added" in pane.mode.text()
    scan = write_scanned_pdf(tmp_path / "scan.pdf")  # two pages, pictures only
    mixed = write_mixed_pdf(tmp_path / "mixed.pdf", tmp_path)
    result = ingest(qtbot, pane, [scan, mixed], wait_ms=OCR_WAIT_MS)
    assert result.ok and not result.value.failed, result.error_message
    assert len(reader.pages) == 3  # scan.pdf's two pages and mixed.pdf's second: never a text-layer page
    listed = {row[0]: row for row in rows(pane)}
    assert listed["scan.pdf"][2] == "2 pages, 2 read by OCR" and int(listed["scan.pdf"][3]) >= 2
    assert listed["mixed.pdf"][2] == "2 pages, 1 read by OCR"
    assert pane.vision_notice.text() == ""  # nothing is left for a vision model
    documents = pane.session.documents
    assert documents.passage(mixed, "page 1").split() == PAGES[0].split()  # the text layer, as without OCR
    ocr_pages = {(scan, 1): None, (scan, 2): None, (mixed, 2): None}
    for pdf, page in ocr_pages:
        text = expected_text(reader, pdf, page)
        assert text and documents.passage(pdf, f"page {page}") == text
        ocr_pages[(pdf, page)] = text
    # a question worded as an OCR-read page reads is answered from it, citing the page: one whose reading no
    # other page shares (the tiny model's random weights may read two pictures of text alike)
    pdf, page = next(key for key, text in ocr_pages.items() if list(ocr_pages.values()).count(text) == 1)
    answer = ask(qtbot, pane, ocr_pages[(pdf, page)]).value
    assert answer.status == "complete"
    assert answer.citations[0].label == f"[1] {pdf.name}, page {page}"
    assert answer.text.startswith(f"[1] {pdf.name}, page {page} says:")


def test_without_an_ocr_model_a_scanned_pdf_stays_for_a_vision_model(qtbot, make_window, tmp_path):
    window = make_window(panes=("documents",))
    pane = window.pane("documents")
    assert "OCR" not in pane.mode.text()
    result = ingest(qtbot, pane, [write_scanned_pdf(tmp_path / "scan.pdf")])
    assert result.ok
    assert rows(pane) == [["scan.pdf", "PDF", "2 pages, scanned (no text layer)", "0"]]


def test_an_ocr_model_that_fails_to_load_is_named_with_the_file(qtbot, make_window, tmp_path):
    broken = tmp_path / "paddle"
    broken.mkdir()
    (broken / "config.json").write_text('{"architectures": ["PaddleOCRVLForConditionalGeneration"]')
    window = make_window(panes=("documents",), ocr=OcrHost(lambda: PageReader.load(broken, device="cpu"), "x"))
    pane = window.pane("documents")
    result = ingest(qtbot, pane, [write_scanned_pdf(tmp_path / "scan.pdf")])
    assert result.ok
    (failure,) = result.value.failed
    assert failure.message.startswith("scan.pdf: its pages have no text and the OCR model failed to load: ")
    assert str(broken) in failure.message and "config.json" in failure.message


def test_a_scanned_pdf_dropped_on_the_chat_is_read_by_ocr_and_searched(qtbot, make_window, tmp_path, reader):
    from .drag import drop

    window = make_window(panes=("chat",), ocr=OcrHost(lambda: reader, "PaddleOCR-VL"))  # a text-only chat model
    pane = window.pane("chat")
    scan = write_scanned_pdf(tmp_path / "scan.pdf")
    with qtbot.waitSignal(pane.attach_finished, timeout=OCR_WAIT_MS):
        drop(pane.transcript, [scan])
    (document,) = pane.documents.documents  # kept in the set as text, not routed to a vision model
    assert document.name == "scan.pdf" and document.ocr_pages == (1, 2) and not document.scanned
    assert pane.error.isHidden() and not pane.tray.pending
    assert pane.documents.passage(scan, "page 1") == expected_text(reader, scan, 1)


def test_with_the_setting_empty_a_paddleocr_in_the_models_folder_reads_scanned_pages(qtbot, make_window, home,
                                                                                      tmp_path):
    import shutil

    window = make_window(panes=("documents",))  # the Studio's own OcrHost, from its settings
    pane = window.pane("documents")
    scan = write_scanned_pdf(tmp_path / "scan.pdf", PAGES[:1])
    ingest(qtbot, pane, [scan])
    assert rows(pane)[0][2] == "1 page, scanned (no text layer)"  # nothing installed yet
    shutil.copytree(MODEL, home / "models" / "acme" / "paddleocr-vl")  # downloaded meanwhile
    result = ingest(qtbot, pane, [scan], wait_ms=OCR_WAIT_MS)
    assert result.ok and not result.value.failed
    assert rows(pane)[0][2] == "1 page, 1 read by OCR"
    assert "read by" in pane.session.documents.ocr.notice  # named now that it is loaded
