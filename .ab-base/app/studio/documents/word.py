"""DOCX through python-docx: headings start sections; paragraphs and tables stay in document order."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from app.studio.documents.detect import check_unzipped_size
from app.studio.documents.model import DocumentError, Section
from app.studio.documents.outline import OutlineBuilder

_HEADING_STYLE = re.compile(r"^heading (\d)$", re.IGNORECASE)
# Paragraphs and table cells read from one document: a 500-page report has ~20,000; python-docx spends
# ~50 µs on each (styles, cell grids), so a 333 KB file of 3 million empty paragraphs would take minutes.
MAX_ELEMENTS = 100_000


def heading_level(style_name: str | None) -> int:
    """1-9 for Word's built-in heading styles (the Title style counts as 1), else 0."""
    if not style_name:
        return 0
    if style_name.lower() == "title":
        return 1
    match = _HEADING_STYLE.match(style_name)
    return int(match.group(1)) if match else 0


def read_docx(path: Path) -> list[Section]:
    """Sections per heading ("section Intro"), and one per table ("section Intro, table 1")."""
    import docx
    from docx.table import Table

    check_unzipped_size(path)
    try:
        document = docx.Document(str(path))
    except Exception as exc:  # python-docx reports damage as OpcError, KeyError, lxml syntax errors...
        raise DocumentError(path, f"the Word document is corrupt or unreadable ({exc!r})") from exc
    _check_element_count(path, document.element.body)

    builder = OutlineBuilder()
    table_number = 0
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            table_number += 1
            builder.add_table(_table_rows(block), table_number)
            continue
        style_name = block.style.name if block.style is not None else None
        level = heading_level(style_name)
        if level:
            builder.start_heading(block.text.strip(), level)
        else:
            builder.add_paragraph(block.text)
    return builder.finish()


def _table_rows(table: object) -> list[list[str]]:
    # Merged cells appear once per grid column they span, which keeps the columns aligned.
    return [[cell.text.strip() for cell in row.cells] for row in table.rows]  # type: ignore[attr-defined]


def _check_element_count(path: Path, body: Any) -> None:
    """Count paragraphs and table cells with lxml (fast, proportional to the XML), before python-docx
    walks them; refuse a document with more than MAX_ELEMENTS."""
    from docx.oxml.ns import qn

    elements = body.iter(qn("w:p"), qn("w:tc"))
    if next(itertools.islice(elements, MAX_ELEMENTS, None), None) is not None:
        raise DocumentError(
            path, f"it has more than {MAX_ELEMENTS:,} paragraphs and table cells, more than this reader takes"
        )
