"""Decide what kind of document a file is, and refuse files we must not read.

The file name's extension says what the user expects; the first bytes say what the file is.
When they disagree we say so instead of handing a ZIP to the PDF reader.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from app.studio.documents.model import DocumentError

MAX_FILE_BYTES = 200 * 1024 * 1024  # larger files are refused before any parsing
MAX_UNZIPPED_BYTES = 512 * 1024 * 1024  # a DOCX/XLSX whose parts add up to more is a ZIP bomb

EXTENSION_KINDS = {
    ".pdf": "pdf",
    ".docx": "docx",
    ".xlsx": "xlsx",
    ".xlsm": "xlsx",
    ".txt": "text",
    ".text": "text",
    ".log": "text",
    ".csv": "text",
    ".md": "markdown",
    ".markdown": "markdown",
}

# Parts whose presence inside an Office Open XML ZIP tells Word from Excel.
_ZIP_MARKERS = {"docx": "word/document.xml", "xlsx": "xl/workbook.xml"}
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # compound file: legacy .doc/.xls or encrypted Office
_KIND_NAMES = {"pdf": "a PDF", "docx": "a Word document (DOCX)", "xlsx": "an Excel workbook (XLSX)"}


def supported_extensions() -> list[str]:
    return sorted(EXTENSION_KINDS)


def check_file(path: Path, max_bytes: int = MAX_FILE_BYTES) -> int:
    """Existence, type and size checks; returns the size in bytes."""
    if not path.exists():
        raise DocumentError(path, "file not found")
    if not path.is_file():
        raise DocumentError(path, "not a regular file")
    size = path.stat().st_size
    if size == 0:
        raise DocumentError(path, "the file is empty")
    if size > max_bytes:
        raise DocumentError(path, f"the file is too large ({size:,} bytes; the limit is {max_bytes:,})")
    return size


def detect_kind(path: Path) -> str:
    """The document kind, checked against the file's content."""
    sniffed = _sniff(path)
    expected = EXTENSION_KINDS.get(path.suffix.lower())
    if expected is None:
        if sniffed in ("pdf", "docx", "xlsx"):
            return sniffed
        raise DocumentError(
            path,
            f"unknown format {path.suffix or '(no extension)'!r}; supported: {', '.join(supported_extensions())}",
        )
    if expected in ("text", "markdown"):
        return expected
    if sniffed == expected:
        return expected
    raise DocumentError(
        path, f"not a valid {path.suffix.lower().lstrip('.').upper()} file: {_describe(sniffed)}"
    )


def _sniff(path: Path) -> str:
    with path.open("rb") as handle:
        head = handle.read(8)
    if head.startswith(b"%PDF"):
        return "pdf"
    if head.startswith(_OLE_MAGIC):
        return "ole"
    if head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as archive:
                names = set(archive.namelist())
        except zipfile.BadZipFile:
            return "bad-zip"
        for kind, marker in _ZIP_MARKERS.items():
            if marker in names:
                return kind
        return "zip"
    return "other"


def _describe(sniffed: str) -> str:
    if sniffed in _KIND_NAMES:
        return f"its content is {_KIND_NAMES[sniffed]}"
    return {
        "ole": "it is password-protected or in the old binary Office format (.doc/.xls); "
        "save it as .docx/.xlsx without a password",
        "bad-zip": "it looks like a ZIP archive but is corrupt or truncated",
        "zip": "it is a ZIP archive without the parts an Office document has",
    }.get(sniffed, "its content is neither a PDF nor an Office document")


def check_unzipped_size(path: Path, max_bytes: int = MAX_UNZIPPED_BYTES) -> None:
    """Refuse an Office file whose ZIP parts would decompress past `max_bytes`, before reading any."""
    try:
        with zipfile.ZipFile(path) as archive:
            total = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError) as exc:
        raise DocumentError(path, f"the file is not a readable ZIP archive ({exc})") from exc
    if total > max_bytes:
        raise DocumentError(
            path,
            f"its parts decompress to {total:,} bytes, more than the {max_bytes:,} allowed (a ZIP bomb?)",
        )
