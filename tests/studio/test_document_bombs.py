"""Document bombs get a clear DocumentError with bounded work and memory: a page range of two billion,
a DOCX of millions of empty paragraphs, an XLSX with cells at A1 and XFD1048576, a ZIP whose parts
decompress to gigabytes, and a PDF Flate bomb, which is read in a child process so that PDFium's
abort is an error, not the end of the Studio. Each file is generated small and fast."""

from __future__ import annotations

import struct
import threading
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import pytest

from app.studio.documents import (
    DocumentError,
    ExtractionCancelled,
    extract_document,
    isolation,
    parse_page_spec,
    render_pages,
)
from app.studio.documents.spreadsheet import MAX_CELLS
from app.studio.documents.word import MAX_ELEMENTS
from app.studio.tasks import CancelToken
from tests.studio.doc_files import write_docx, write_pdf


def test_a_page_range_of_two_billion_is_clamped_to_the_document(tmp_path):
    pdf = write_pdf(tmp_path / "three.pdf")
    document = extract_document(pdf, pages=parse_page_spec("2-2000000000,1-2000000000"))
    assert [s.location for s in document.sections] == ["page 2", "page 3", "page 1"]
    with pytest.raises(DocumentError, match="page 7 does not exist; the PDF has 3 page"):
        extract_document(pdf, pages=parse_page_spec("7-2000000000"))


def _docx_with_empty_paragraphs(path: Path, count: int) -> Path:
    """A real DOCX whose document.xml holds `count` empty paragraphs (the XML compresses ~1000:1)."""
    template = write_docx(path.with_suffix(".template.docx"))
    with zipfile.ZipFile(template) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == "word/document.xml":
                data = data.replace(b"<w:body>", b"<w:body>" + b"<w:p/>" * count, 1)
            out.writestr(item, data)
    return path


def test_a_docx_with_three_million_paragraphs_is_refused(tmp_path):
    bomb = _docx_with_empty_paragraphs(tmp_path / "paragraphs.docx", 3_000_000)
    assert bomb.stat().st_size < 1_000_000
    with pytest.raises(DocumentError, match=f"more than {MAX_ELEMENTS:,} paragraphs and table cells"):
        extract_document(bomb)


def test_a_docx_just_under_the_cap_is_read(tmp_path):
    document = extract_document(_docx_with_empty_paragraphs(tmp_path / "long.docx", 1000))
    assert "The team travels to Lyon by train." in document.text


def test_an_xlsx_with_cells_at_a1_and_xfd1048576_is_refused_without_building_the_grid(tmp_path):
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Corners"
    sheet["A1"], sheet["XFD1048576"] = "top left", "bottom right"
    book.save(tmp_path / "corners.xlsx")
    tracemalloc.start()
    try:
        with pytest.raises(DocumentError, match="sheet 'Corners' spans 1,048,576 rows by 16,384 columns"):
            extract_document(tmp_path / "corners.xlsx")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 500 * 2**20  # the 17-billion-cell grid was never built


def test_an_xlsx_with_far_apart_real_cells_inside_the_cap_is_read(tmp_path):
    import openpyxl

    book = openpyxl.Workbook()
    book.active["A1"], book.active["C5000"] = "first", "last"
    book.save(tmp_path / "sparse.xlsx")
    (section,) = extract_document(tmp_path / "sparse.xlsx").sections
    assert section.table is not None and len(section.table) == 5000 and section.table[-1] == ["", "", "last"]
    assert MAX_CELLS >= 5000 * 3


def test_an_office_zip_bomb_is_refused_before_decompression(tmp_path):
    bomb = tmp_path / "bomb.docx"
    template = write_docx(tmp_path / "template.docx")
    with zipfile.ZipFile(template) as source, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as out:
        for item in source.infolist():
            out.writestr(item, source.read(item))
        with out.open("word/media/padding.bin", "w", force_zip64=True) as padding:
            block = bytes(2**20)
            for _ in range(600):  # 600 MiB of zeros: ~0.6 MB compressed
                padding.write(block)
    with pytest.raises(
        DocumentError, match=r"decompress to 629,\d{3},\d{3} bytes, more than the 536,870,912 allowed"
    ):
        extract_document(bomb)


def _flate_bomb_pdf(path: Path, megabytes: int) -> Path:
    """A one-page PDF whose content stream is `megabytes` MiB of spaces, Flate-compressed (~1000:1)."""
    stream = _spaces_deflated(megabytes)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path.write_bytes(bytes(out))
    return path


def _spaces_deflated(megabytes: int) -> bytes:
    """zlib data for `megabytes` MiB of spaces without compressing them all: after a full flush each
    MiB compresses to the same bytes, so one is repeated; the Adler-32 of n equal bytes has a closed form."""
    compressor, block = zlib.compressobj(9), b" " * 2**20
    first = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    repeat = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    assert compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH) == repeat
    n, prime = megabytes * 2**20, 65521
    a, b = (1 + n * 32) % prime, (n + 32 * n * (n + 1) // 2) % prime
    return first + repeat * (megabytes - 1) + compressor.flush()[:-4] + struct.pack(">I", b << 16 | a)


def test_the_bomb_generator_makes_valid_zlib_data():
    assert zlib.decompress(_spaces_deflated(3)) == b" " * 3 * 2**20


def test_a_pdf_flate_bomb_is_an_error_not_the_death_of_the_process(tmp_path):
    bomb = _flate_bomb_pdf(tmp_path / "bomb.pdf", 1024)  # 1 GiB of content from ~1 MB: PDFium aborts on it
    assert bomb.stat().st_size < 2_000_000
    with pytest.raises(DocumentError, match=r"bomb\.pdf: "):
        extract_document(bomb)
    with pytest.raises(DocumentError, match=r"bomb\.pdf: "):
        render_pages(bomb, dpi=30)


def test_a_crash_of_the_pdf_reader_is_a_document_error(tmp_path):
    pdf = write_pdf(tmp_path / "fine.pdf")
    with pytest.raises(DocumentError, match="the PDF reader crashed on this file"):
        isolation.run_isolated(pdf, _abort, pdf)


def test_extraction_in_progress_stops_when_the_caller_cancels(tmp_path):
    pdf = write_pdf(tmp_path / "fine.pdf")
    token = CancelToken()
    threading.Timer(0.5, token.cancel).start()
    with pytest.raises(ExtractionCancelled, match=r"reading fine\.pdf was cancelled"):
        isolation.run_isolated(pdf, _hang, pdf, cancel=lambda: token.cancelled)


def test_a_cancelled_extraction_does_not_start(tmp_path):
    with pytest.raises(ExtractionCancelled):
        extract_document(write_pdf(tmp_path / "fine.pdf"), cancel=lambda: True)


def _abort(path: Path) -> None:
    import os

    os.abort()  # what PDFium does on some bombs


def _hang(path: Path) -> None:
    import time

    time.sleep(60)
