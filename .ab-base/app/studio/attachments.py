"""Files attached to a chat question: images as their bytes, documents as their extracted text.

Qt-free. `read_attachment` runs on a worker (a PDF is read in a child process by the
document extraction service, app/studio/documents/). Images go to the model as image
parts, so only a model with vision takes them (`doc_qa.supports_vision`); a document's
text is sent whole with the question, under its name, as LM Studio sends a file that fits
the context (a file too long for the context is refused by the chat with both numbers).

A scanned PDF (no text layer) is `ScannedPDF`: for a vision model `read_files` sends its first
pages as images instead, rendered at the model's own resolution as the Documents pane renders
them (`page_qa.page_scale`), at most `MAX_CHAT_PAGES` with a sentence saying so; for a text-only
model its message is the Documents pane's own (`doc_qa.needs_vision_message`).

`IMAGE_MARK` is where an image sits in a turn's text until the model's vision prompter
expands it into image tokens: a private-use character, stripped from what the user typed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.studio.doc_qa import needs_vision_message
from app.studio.documents import (
    DocumentError,
    ExtractionCancelled,
    PageScale,
    extract_document,
    render_pages,
    supported_extensions,
)
from app.studio.documents.pdf import PageSelection
from app.studio.history import Attachment
from app.studio.page_qa import png_bytes

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp"})
MAX_IMAGE_BYTES = 20 * 2**20  # as the API server's default cap on one image
IMAGE_MARK = "\ue000"
# A scanned PDF's pages all go in one message, each an image of a few hundred tokens: the first ones only
MAX_CHAT_PAGES = 8


class AttachmentError(ValueError):
    """A file cannot be attached; the message names the file and says why."""


class ScannedPDF(AttachmentError):
    """A PDF without a text layer: only a vision model can read it, from its pages' images."""

    def __init__(self, path: Path, page_count: int) -> None:
        super().__init__(needs_vision_message([path]))
        self.path, self.page_count = path, page_count


@dataclass(frozen=True)
class ReadFiles:
    """Files read for the next message, and a sentence for each that could not go (or went only in part)."""

    attachments: list[Attachment] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def is_image_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def can_attach(path: str | Path) -> bool:
    return is_image_file(path) or Path(path).suffix.lower() in supported_extensions()


def read_attachment(path: str | Path, cancel: Callable[[], bool] | None = None) -> Attachment:
    """The file as an attachment. AttachmentError naming the file when it cannot be read or is empty."""
    path = Path(path)
    if is_image_file(path):
        try:
            size = path.stat().st_size
            if size > MAX_IMAGE_BYTES:
                raise AttachmentError(f"{path.name}: the image is {size / 2**20:.1f} MiB; at most "
                                      f"{MAX_IMAGE_BYTES // 2**20} MiB can be attached.")
            return Attachment("image", path.name, path.read_bytes())
        except OSError as exc:
            raise AttachmentError(f"{path.name}: cannot be read ({exc.strerror or exc}).") from exc
    if not can_attach(path):
        raise AttachmentError(f"{path.name}: only images (PNG, JPEG, WebP, GIF, BMP) and PDF, Word, Excel, text "
                              "and Markdown files can be attached.")
    try:
        document = extract_document(path, cancel=cancel)
    except DocumentError as exc:
        raise AttachmentError(str(exc)) from exc
    text = document.text.strip()
    if not text and document.kind == "pdf":
        raise ScannedPDF(path, document.page_count or 0)
    if not text:
        raise AttachmentError(f"{path.name}: no text was found in it.")
    return Attachment("document", path.name, text.encode("utf-8"))


def read_pages(path: Path, page_count: int, scale: PageScale, limit: int = MAX_CHAT_PAGES,
               cancel: Callable[[], bool] | None = None) -> tuple[list[Attachment], str | None]:
    """A scanned PDF's first `limit` pages as image attachments ("scan.pdf, page 2") rendered at `scale`,
    and a sentence when pages were left out. DocumentError when the PDF cannot be rendered."""
    images = render_pages(path, dpi=scale, pages=PageSelection(((1, limit),)), cancel=cancel)
    pages = [Attachment("image", f"{path.name}, page {n}", png_bytes(image)) for n, image in enumerate(images, 1)]
    if page_count <= len(pages):
        return pages, None
    return pages, (f"{path.name} has {page_count} pages: only pages 1-{len(pages)} go with your message as "
                   f"images (at most {limit} pages per message). Ask about the rest in the Documents pane.")


def read_files(paths: Sequence[Path], cancelled: Callable[[], bool], scale: PageScale | None = None) -> ReadFiles:
    """Each file as an attachment, or why it cannot be one; a scanned PDF as its pages' images when `scale`
    (the loaded vision model's page resolution) is given, else the sentence saying a vision model is needed."""
    read = ReadFiles()
    for path in paths:
        if cancelled():
            break
        try:
            read.attachments.append(read_attachment(path, cancel=cancelled))
        except ScannedPDF as scanned:
            if scale is None:
                read.problems.append(str(scanned))
                continue
            try:
                pages, note = read_pages(scanned.path, scanned.page_count, scale, cancel=cancelled)
            except DocumentError as exc:
                read.problems.append(str(exc))
                continue
            read.attachments.extend(pages)
            read.problems.extend([note] if note else [])
        except AttachmentError as exc:
            read.problems.append(str(exc))
        except ExtractionCancelled:
            break
    return read


def turn_text(text: str, attachments: Sequence[Attachment], vision: bool) -> str:
    """A question as the model sees it: its documents' text first, each under its name, then an image mark
    per image (a text-only model gets the image's name instead), then what was typed."""
    parts = [f"Attached file {a.name}:\n\n{a.text}\n\n---\n\n" for a in attachments if a.kind == "document"]
    for attachment in attachments:
        if attachment.kind == "image":
            parts.append(IMAGE_MARK if vision else f"[image {attachment.name}: not shown, the model reads text only]\n")
    return "".join(parts) + text.replace(IMAGE_MARK, "")
