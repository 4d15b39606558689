"""What extraction returns: a document as an ordered list of located sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class DocumentError(ValueError):
    """A file could not be read as a document; the message names the file and the problem."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{Path(path).name}: {problem}")


class ExtractionCancelled(Exception):
    """The caller's cancel check turned true while a document was being read."""


@dataclass(frozen=True)
class Section:
    """One located piece of a document.

    `location` is what an answer cites ("page 3", "sheet Budget", "section Intro").
    `text` is always the plain text (a table's rows as tab-separated lines), so text-only
    consumers never need to look at `table`.
    """

    location: str
    text: str
    table: list[list[str]] | None = None
    # DOCX/Markdown headings: the heading text and its level (1 = top); level 0 means no heading.
    title: str | None = None
    level: int = 0
    # XLSX: cell reference -> formula (e.g. "B4" -> "=SUM(B2:B3)"); the table holds cached values.
    formulas: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Document:
    path: Path
    kind: str  # "pdf" | "docx" | "xlsx" | "text" | "markdown"
    sections: list[Section]
    page_count: int | None = None  # PDF only: pages in the file, not just the ones extracted

    @property
    def text(self) -> str:
        """All sections' text, in order, separated by blank lines."""
        return "\n\n".join(section.text for section in self.sections if section.text)


def table_to_text(rows: list[list[str]]) -> str:
    """Rows as tab-separated lines: the plain-text view of a table (trailing empty cells dropped)."""
    lines = []
    for row in rows:
        cells = list(row)
        while cells and not cells[-1]:
            cells.pop()
        lines.append("\t".join(cell.replace("\t", " ").replace("\n", " ") for cell in cells))
    return "\n".join(lines)
