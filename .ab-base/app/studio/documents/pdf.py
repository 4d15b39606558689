"""PDF through pypdfium2: text per page, and pages rendered to images for vision models."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.studio.documents.isolation import run_isolated
from app.studio.documents.model import DocumentError, Section

if TYPE_CHECKING:
    import pypdfium2
    from PIL.Image import Image

# PDFium is not thread-safe: every call into it goes through this lock.
_PDFIUM_LOCK = threading.RLock()

MIN_DPI, MAX_DPI = 18, 600
MAX_PAGE_PIXELS = 60_000_000  # one rendered page; beyond this a poster-sized page would eat the RAM


@dataclass(frozen=True)
class PageScale:
    """Render each page so that one of its edges is `pixels` long: a vision model's own resolution.

    `edge` "long" fits the page inside the model's square; "short" suits a model that cuts an
    elongated image into square crops along its long side (Gemma 3's pan-and-scan), so each crop
    keeps the model's full resolution. The resulting dpi is held to [MIN_DPI, MAX_DPI].
    """

    pixels: int
    edge: str = "long"  # "long" | "short"

    def __post_init__(self) -> None:
        if self.pixels < 1 or self.edge not in ("long", "short"):
            raise ValueError(f"bad page scale {self.pixels} px on the {self.edge!r} edge (long or short)")

    def dpi(self, width_pt: float, height_pt: float) -> float:
        """The dpi for a page of this size in PDF points (1/72 inch)."""
        edge = max(width_pt, height_pt) if self.edge == "long" else min(width_pt, height_pt)
        return min(MAX_DPI, max(MIN_DPI, self.pixels * 72 / edge))


@contextmanager
def open_pdf(path: Path, password: str | None = None) -> Iterator[pypdfium2.PdfDocument]:
    import pypdfium2
    import pypdfium2.raw as pdfium_c

    with _PDFIUM_LOCK:
        try:
            document = pypdfium2.PdfDocument(path, password=password)
        except pypdfium2.PdfiumError as exc:
            code = getattr(exc, "err_code", None)
            if code == pdfium_c.FPDF_ERR_PASSWORD:
                problem = "the PDF is encrypted" + (
                    "; the password given is wrong" if password else " and needs a password"
                )
            elif code == pdfium_c.FPDF_ERR_SECURITY:
                problem = "the PDF uses an unsupported security handler"
            else:
                problem = f"the PDF is corrupt or unreadable ({exc})"
            raise DocumentError(path, problem) from exc
        try:
            yield document
        finally:
            document.close()


@dataclass(frozen=True)
class PageSelection:
    """Pages as the user wrote them ("1-3,5"): inclusive 1-based ranges, never expanded before the
    page count is known."""

    ranges: tuple[tuple[int, int], ...]

    def resolve(self, path: Path, page_count: int) -> list[int]:
        """The pages in the order given, duplicates dropped, each range clamped to the document (work
        proportional to the pages that exist); a range that starts past the last page is an error."""
        chosen: dict[int, None] = {}
        for first, last in self.ranges:
            if first > page_count:
                raise DocumentError(path, f"page {first} does not exist; the PDF has {page_count} page(s)")
            chosen.update(dict.fromkeys(range(first, min(last, page_count) + 1)))
        return list(chosen)


def select_pages(path: Path, page_count: int, pages: Sequence[int] | PageSelection | None) -> list[int]:
    """1-based page numbers to read, checked against the document."""
    if pages is None:
        return list(range(1, page_count + 1))
    if isinstance(pages, PageSelection):
        return pages.resolve(path, page_count)
    for number in pages:
        if not 1 <= number <= page_count:
            raise DocumentError(path, f"page {number} does not exist; the PDF has {page_count} page(s)")
    return list(pages)


def read_pdf(
    path: Path,
    pages: Sequence[int] | PageSelection | None = None,
    password: str | None = None,
    cancel: Callable[[], bool] | None = None,
) -> tuple[list[Section], int]:
    """One section per page ("page 3"), and the file's page count; read in a child process
    (isolation.py), so a file that crashes PDFium is a DocumentError; `cancel()` turning true stops it."""
    return run_isolated(path, _read_pdf_here, path, pages, password, cancel=cancel)


def _read_pdf_here(
    path: Path, pages: Sequence[int] | PageSelection | None, password: str | None
) -> tuple[list[Section], int]:
    import pypdfium2

    sections = []
    with open_pdf(path, password) as document:
        page_count = len(document)
        for number in select_pages(path, page_count, pages):
            try:
                text = _page_text(document, number)
            except pypdfium2.PdfiumError as exc:
                raise DocumentError(path, f"page {number} is corrupt or unreadable ({exc})") from exc
            sections.append(Section(location=f"page {number}", text=text))
    return sections, page_count


def _page_text(document: pypdfium2.PdfDocument, number: int) -> str:
    page = document[number - 1]
    text_page = page.get_textpage()
    try:
        return _clean(text_page.get_text_range())
    finally:
        text_page.close()
        page.close()


def render_pdf_pages(
    path: Path,
    dpi: float | PageScale = 150,
    pages: Sequence[int] | PageSelection | None = None,
    password: str | None = None,
    cancel: Callable[[], bool] | None = None,
) -> list[Image]:
    """Each selected page as an RGB PIL image at `dpi` (PDF units are 1/72 inch), or at each page's
    own dpi under a `PageScale`, rendered in a child process like `read_pdf`."""
    if not isinstance(dpi, PageScale) and not MIN_DPI <= dpi <= MAX_DPI:
        raise ValueError(f"dpi must be between {MIN_DPI} and {MAX_DPI}, got {dpi}")
    return run_isolated(path, _render_here, path, dpi, pages, password, cancel=cancel)


def _render_here(
    path: Path, dpi: float | PageScale, pages: Sequence[int] | PageSelection | None, password: str | None
) -> list[Image]:
    images = []
    with open_pdf(path, password) as document:
        for number in select_pages(path, len(document), pages):
            page = document[number - 1]
            try:
                width, height = page.get_size()
                page_dpi = dpi.dpi(width, height) if isinstance(dpi, PageScale) else dpi
                scale = page_dpi / 72
                if width * scale * height * scale > MAX_PAGE_PIXELS:
                    raise DocumentError(path, f"page {number} is too large to render at {page_dpi:.0f} dpi")
                bitmap = page.render(scale=scale)
                images.append(bitmap.to_pil().convert("RGB"))
            finally:
                page.close()
    return images


def _clean(text: str) -> str:
    # PDFium ends lines with CRLF; callers want plain newlines and no trailing blanks.
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip()
