"""Which PDF pages a vision model reads for a question (app/studio/doc_pages.py), and at what size
they are rendered (PageScale): real PDFs written here, the real MiniLM embedder for the ranking."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from studio.doc_files import PAGES, write_docx, write_pdf, write_scanned_pdf

from app.studio.doc_pages import page_citations
from app.studio.doc_qa import DocumentSet
from app.studio.documents import PageScale, render_pages
from app.studio.documents.pdf import MAX_DPI, MIN_DPI
from app.studio.page_qa import page_scale


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pages")
    documents = DocumentSet(keep_scanned=True, min_relevance=-1.0)
    report = documents.ingest([write_pdf(folder / "festival.pdf"), write_scanned_pdf(folder / "scan.pdf"),
                               write_docx(folder / "travel.docx")])
    assert not report.failed and [d.scanned for d in report.added] == [False, True, False]
    return documents


def labels(citations) -> list[str]:
    return [c.label for c in citations]


def test_every_page_goes_when_they_are_few(documents):
    citations = page_citations(documents, "How much do pears cost?")
    assert labels(citations) == ["[1] festival.pdf, page 1", "[2] festival.pdf, page 2", "[3] festival.pdf, page 3",
                                 "[4] scan.pdf, page 1", "[5] scan.pdf, page 2"]
    assert all(c.image for c in citations)
    assert citations[2].text == PAGES[2] and citations[3].text == ""  # the scan has no text to show


def test_past_the_limit_the_most_relevant_pages_then_the_scans(documents):
    pears = page_citations(documents, "How much do pears cost at the orchard market?", limit=1)
    assert labels(pears) == ["[1] festival.pdf, page 3"]
    tickets = page_citations(documents, "What do tickets for adults cost?", limit=2)
    assert labels(tickets) == ["[1] festival.pdf, page 2", "[2] festival.pdf, page 3"]  # ranked, then page order
    # every text page ranked, the scanned pages fill the rest before any unranked page
    three = page_citations(DocumentSetView(documents, ranked_only=1), "Pears?", limit=3)
    assert labels(three) == ["[1] festival.pdf, page 3", "[2] scan.pdf, page 1", "[3] scan.pdf, page 2"]


class DocumentSetView:
    """The set, its retrieval cut to the first `ranked_only` hits (as a high relevance floor would)."""

    def __init__(self, documents: DocumentSet, ranked_only: int) -> None:
        self._documents, self._ranked_only = documents, ranked_only
        self.documents = documents.documents
        self.passage = documents.passage

    def retrieve(self, question, k=None):
        return self._documents.retrieve(question, k)[: self._ranked_only]


@pytest.mark.parametrize(("scale", "size", "dpi"), [
    (PageScale(896), (612, 792), 896 * 72 / 792),  # US Letter: the long edge at the tower's side
    (PageScale(896, "short"), (612, 792), 896 * 72 / 612),  # pan-and-scan: the short edge
    (PageScale(10), (612, 792), MIN_DPI),
    (PageScale(100_000), (612, 792), MAX_DPI),
])
def test_page_scale_gives_each_page_its_dpi(scale, size, dpi):
    assert scale.dpi(*size) == pytest.approx(dpi)


def test_pages_render_at_the_models_resolution(tmp_path):
    pdf = write_pdf(tmp_path / "a.pdf", PAGES[:1])  # fpdf's default page: A4, 595 x 842 points
    client = SimpleNamespace(vision=SimpleNamespace(config=SimpleNamespace(image_size=896, pan_and_scan=None)))
    [page] = render_pages(pdf, dpi=page_scale(client))
    assert max(page.size) == 896
    client.vision.config.pan_and_scan = object()
    [page] = render_pages(pdf, dpi=page_scale(client))
    assert min(page.size) == 896 and max(page.size) > 896


def test_a_bad_page_scale_is_refused():
    with pytest.raises(ValueError, match="long or short"):
        PageScale(896, "wide")
