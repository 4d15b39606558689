"""Scanned pages read by the OCR model as documents are ingested (app/studio/ocr.py through DocumentSet),
with the tiny random-weight PaddleOCR-VL of tests/fixtures/vision/paddleocr_vl and the real MiniLM: which
pages go to it, the model loaded once, cancel between and inside pages, and the set kept across restarts."""

from __future__ import annotations

from pathlib import Path

import pytest
from studio.doc_files import PAGES, write_pdf, write_scanned_pdf

from app.engine.tasks.ocr import PageReader
from app.studio.doc_qa import DocumentSet
from app.studio.documents import Document, Section
from app.studio.ocr import OcrHost, textless_pages
from app.studio.retrieval import IngestCancelled

MODEL = Path(__file__).parents[1] / "fixtures" / "vision" / "paddleocr_vl" / "hf"


@pytest.fixture(scope="module")
def reader() -> PageReader:
    return PageReader.load(MODEL, device="cpu", max_reply_tokens=8)


class CountingSource:
    """An OCR source that counts its loads, and the pages its reader is given."""

    def __init__(self, reader: PageReader) -> None:
        self.reader, self.loads, self.pages = reader, 0, 0

    def __call__(self) -> CountingSource:
        self.loads += 1
        return self

    @property
    def max_pixels(self) -> int:
        return self.reader.max_pixels

    @property
    def model_name(self) -> str:
        return self.reader.model_name

    def read(self, data: bytes, cancel=None) -> str:
        self.pages += 1
        return self.reader.read(data, cancel=cancel)


def test_only_pdf_pages_without_text_are_textless():
    sections = [Section("page 1", "typed"), Section("page 2", "  \n"), Section("page 3", "")]
    assert textless_pages(Document(Path("a.pdf"), "pdf", sections, 3)) == [2, 3]
    assert textless_pages(Document(Path("a.docx"), "docx", [Section("section A", "")])) == []


def test_the_ocr_model_loads_once_and_reads_only_scanned_pages(tmp_path, reader):
    source = CountingSource(reader)
    documents = DocumentSet(ocr=OcrHost(source, "tiny"), keep_scanned=True)
    report = documents.ingest([write_pdf(tmp_path / "typed.pdf")])
    assert source.loads == 0  # nothing to read: the model is not even loaded
    assert report.added[0].describe() == "3 pages"
    report = documents.ingest([write_scanned_pdf(tmp_path / "scan.pdf"), write_scanned_pdf(tmp_path / "b.pdf", PAGES[2:])])
    assert (source.loads, source.pages) == (1, 3)
    assert [d.describe() for d in report.added] == ["2 pages, 2 read by OCR", "1 page, 1 read by OCR"]
    assert [d.ocr_pages for d in report.added] == [(1, 2), (1,)]
    assert not documents.scanned


def test_cancel_inside_a_page_adds_nothing(tmp_path, reader):
    source = CountingSource(reader)
    documents = DocumentSet(ocr=OcrHost(source, "tiny"), keep_scanned=True)
    steps = iter(range(1000))
    # false until the first page is being read; then the engine's second step sees it turn true
    with pytest.raises(IngestCancelled):
        documents.ingest([write_scanned_pdf(tmp_path / "scan.pdf")],
                         cancel=lambda: source.pages > 0 and next(steps) >= 2)  # fmt: skip
    assert source.pages == 1 and not documents.documents
    assert not reader.task.engine.has_unfinished()  # the page's request was aborted, not left running


def test_the_read_pages_are_kept_across_restarts(tmp_path, reader):
    store = tmp_path / "store"
    first = DocumentSet(store=store, ocr=OcrHost(lambda: reader, "tiny"), keep_scanned=True)
    scan = write_scanned_pdf(tmp_path / "scan.pdf")
    first.ingest([scan])
    text = first.passage(scan, "page 2")
    assert text
    again = DocumentSet(store=store, keep_scanned=True)  # no OCR model now: what was read stays read
    (document,) = again.documents
    assert document.ocr_pages == (1, 2) and document.describe() == "2 pages, 2 read by OCR"
    assert again.passage(scan, "page 2") == text
