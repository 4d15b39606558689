"""The one entry point: any supported file in, a `Document` (or page images) out."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app.studio.documents.detect import MAX_FILE_BYTES, check_file, detect_kind
from app.studio.documents.model import Document, DocumentError, ExtractionCancelled, Section
from app.studio.documents.pdf import PageScale, PageSelection, read_pdf, render_pdf_pages
from app.studio.documents.spreadsheet import read_xlsx
from app.studio.documents.text import read_markdown, read_text
from app.studio.documents.word import read_docx

if TYPE_CHECKING:
    from PIL.Image import Image

_READERS: dict[str, Callable[[Path], list[Section]]] = {
    "docx": read_docx,
    "xlsx": read_xlsx,
    "text": read_text,
    "markdown": read_markdown,
}
_PAGE_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def extract_document(
    path: str | Path,
    pages: Sequence[int] | PageSelection | None = None,
    password: str | None = None,
    max_bytes: int = MAX_FILE_BYTES,
    cancel: Callable[[], bool] | None = None,
) -> Document:
    """Read a PDF, DOCX, XLSX, TXT or Markdown file.

    `pages` (1-based) selects PDF pages; `password` opens an encrypted PDF; `cancel()` turning true
    stops a PDF being read (ExtractionCancelled). Raises DocumentError naming the file and the problem.
    """
    path = Path(path)
    check_file(path, max_bytes)
    kind = detect_kind(path)
    if cancel is not None and cancel():
        raise ExtractionCancelled(f"reading {path.name} was cancelled")
    if kind == "pdf":
        sections, page_count = read_pdf(path, pages, password, cancel=cancel)
        return Document(path=path, kind=kind, sections=sections, page_count=page_count)
    if pages is not None:
        raise DocumentError(path, "selecting pages works only for PDF files")
    return Document(path=path, kind=kind, sections=_READERS[kind](path))


def render_pages(
    path: str | Path,
    dpi: float | PageScale = 150,
    pages: Sequence[int] | PageSelection | None = None,
    password: str | None = None,
    max_bytes: int = MAX_FILE_BYTES,
    cancel: Callable[[], bool] | None = None,
) -> list[Image]:
    """PDF pages as RGB PIL images for vision models (all pages unless `pages`, 1-based, is given)."""
    path = Path(path)
    check_file(path, max_bytes)
    if detect_kind(path) != "pdf":
        raise DocumentError(path, "only PDF pages can be rendered as images")
    return render_pdf_pages(path, dpi, pages, password, cancel=cancel)


def parse_page_spec(spec: str) -> PageSelection:
    """Turn "1-3,5" into a `PageSelection`: 1-based ranges, kept as ranges until the page count is
    known (so "1-2000000000" costs nothing), then clamped to the document and de-duplicated."""
    ranges = []
    for part in spec.replace(" ", "").split(","):
        match = _PAGE_RANGE.match(part)
        if not match:
            raise ValueError(f"bad page selection {spec!r}: expected numbers and ranges like '1-3,5'")
        first = int(match.group(1))
        last = int(match.group(2) or first)
        if first < 1 or last < first:
            raise ValueError(f"bad page range {part!r} in {spec!r}: pages start at 1 and ranges go upwards")
        ranges.append((first, last))
    return PageSelection(tuple(ranges))
