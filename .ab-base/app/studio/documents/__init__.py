"""Document extraction for the Studio: PDF, DOCX, XLSX, TXT and Markdown as located sections.

`extract_document(path)` returns a `Document` whose sections carry the location an answer
cites ("page 3", "sheet Budget", "section Intro"); `render_pages(path, dpi)` gives PDF pages
as images for vision models. Every failure is a `DocumentError` naming the file.
"""

from __future__ import annotations

from app.studio.documents.detect import MAX_FILE_BYTES, supported_extensions
from app.studio.documents.extract import extract_document, parse_page_spec, render_pages
from app.studio.documents.model import Document, DocumentError, ExtractionCancelled, Section
from app.studio.documents.pdf import PageScale
from app.studio.documents.render import FORMATS, render_document, to_json, to_markdown, to_text

__all__ = [
    "FORMATS",
    "MAX_FILE_BYTES",
    "Document",
    "DocumentError",
    "ExtractionCancelled",
    "PageScale",
    "Section",
    "extract_document",
    "parse_page_spec",
    "render_document",
    "render_pages",
    "supported_extensions",
    "to_json",
    "to_markdown",
    "to_text",
]
