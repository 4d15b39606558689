"""Scanned pages read by an OCR model (PaddleOCR-VL) when documents are ingested.

`OcrHost` holds the one OCR model the `documents.ocr_model` setting names, loaded where it is first
needed (a PDF with pages that have no text layer) and then shared. With the setting empty, the first
usable PaddleOCR-VL of the models folder is that model (looked for at that first need, and again at
the next one while there is none: it may be downloaded meanwhile); without one, scanned PDFs go on as
before (kept for a vision model, or refused with the reason).

`read_scanned_pages` is the ingest step: a PDF's pages without text are rendered (pypdfium2, in the
child process documents/pdf.py reads with) near the model's pixel budget and sent to it one by one;
each reply becomes that page's text, so the page is chunked, embedded and cited ("scan.pdf, page 2")
as a text-layer page is. Pages with a text layer keep it: OCR is for pages that have nothing else.
"""

from __future__ import annotations

import io
import logging
import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from app.studio.documents import Document, DocumentError, ExtractionCancelled, PageScale, render_pages

log = logging.getLogger(__name__)
OcrSource = Callable[[], Any]  # -> a PageReader (app.engine.tasks.ocr)
OcrProgress = Callable[[int, int, str], None]  # (pages read, pages to read, message)
CancelCheck = Callable[[], bool]


def ocr_source(path: str, device: str = "auto") -> OcrSource | None:
    """The setting's OCR model as a source (None for an empty setting: no OCR)."""
    if not path:
        return None

    def load() -> Any:
        from app.engine.tasks.ocr import PageReader

        return PageReader.load(path, device=device)

    return load


def installed_ocr_source(entries: Callable[[], Iterable[Any]], device: str = "auto") -> OcrSource:
    """The first usable model of `entries()` (the models folder's ModelEntry list) whose job is OCR, as
    a source; it gives None while there is none."""

    def load() -> Any:
        from app.engine.tasks.ocr import PageReader

        found = next((e for e in entries() if e.usable and e.job_note and e.job_note[0] == "OCR"), None)
        return None if found is None else PageReader.load(found.path, device=device)

    return load


class OcrHost:
    """One OCR model, loaded once on first `get()` (None when there is none)."""

    def __init__(self, source: OcrSource | None = None, name: str | None = None) -> None:
        """`name`: what the Documents pane calls the model before it is loaded (None: only once it is)."""
        self._source, self._name = source, name
        self._reader: Any = None
        self._lock = threading.Lock()  # two first uses on two threads load the model once

    @property
    def configured(self) -> bool:
        return self._source is not None

    @property
    def notice(self) -> str:
        """What the Documents pane says of scanned PDFs while an OCR model is set ("" without one)."""
        name = self._reader.model_name if self._reader is not None else self._name
        if not self.configured or name is None:
            return ""
        return f"Scanned PDF pages (no text layer) are read by {name} (OCR) as they are added, and cited by page."

    def get(self) -> Any:
        """The reader, loaded now if nothing has loaded it yet; None without an OCR model."""
        if self._source is None:
            return None
        with self._lock:
            if self._reader is None:
                self._reader = self._source()
                if self._reader is not None:
                    log.info("OCR model loaded: %s", self._reader.model_name)
            return self._reader


def page_scale(reader: Any) -> PageScale:
    """Pages rendered with their long edge at sqrt(2 x max_pixels): an A4 page then holds about the
    model's pixel budget, and the processor scales anything larger down to it."""
    return PageScale(math.isqrt(2 * reader.max_pixels), "long")


def textless_pages(document: Document) -> list[int]:
    """The 1-based numbers of a PDF's pages without a text layer."""
    if document.kind != "pdf":
        return []
    return [int(s.location.removeprefix("page ")) for s in document.sections if not s.text.strip()]


def read_scanned_pages(document: Document, reader: Any, progress: OcrProgress | None = None,
                       cancel: CancelCheck | None = None) -> tuple[Document, list[int]]:  # fmt: skip
    """`document` with its textless pages' text read by `reader`, and those pages' numbers. A page
    the model finds no text on stays empty. DocumentError names the file if a page cannot be rendered
    or read; `cancel()` turning true raises ExtractionCancelled, between pages or inside one."""
    from app.engine.tasks.ocr import OcrCancelled

    pages = textless_pages(document)
    if not pages:
        return document, []
    texts: dict[int, str] = {}
    images = render_pages(document.path, dpi=page_scale(reader), pages=pages, cancel=cancel)
    for done, (number, image) in enumerate(zip(pages, images, strict=True)):
        if progress is not None:
            progress(done, len(pages), f"Reading page {number} of {document.path.name} by OCR…")
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        try:
            texts[number] = reader.read(buffer.getvalue(), cancel=cancel)
        except OcrCancelled:
            raise ExtractionCancelled(f"OCR of {document.path.name} cancelled at page {number}") from None
        except ValueError as exc:  # an ImageError or a page too large for the model's context
            raise DocumentError(document.path, f"page {number} could not be read by OCR ({exc})") from None
    sections = [
        replace(s, text=texts.get(int(s.location.removeprefix("page ")), s.text)) if s.location.startswith("page ")
        else s
        for s in document.sections
    ]  # fmt: skip
    return replace(document, sections=sections), pages
