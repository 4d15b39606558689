"""Turns a stream of headings, paragraphs and tables into located sections (DOCX and Markdown)."""

from __future__ import annotations

from app.studio.documents.model import Section, table_to_text

PREAMBLE_LOCATION = "start of document"  # text before the first heading


class OutlineBuilder:
    """Collects paragraphs under the current heading; each table becomes a section of its own."""

    def __init__(self) -> None:
        self.sections: list[Section] = []
        self.title: str | None = None
        self.level = 0
        self.paragraphs: list[str] = []
        self.heading_pending = False  # a heading with no paragraph yet still deserves its own section

    @property
    def location(self) -> str:
        return f"section {self.title}" if self.title else PREAMBLE_LOCATION

    def start_heading(self, title: str, level: int) -> None:
        self._flush()
        self.title, self.level, self.heading_pending = title or "(untitled)", level, True

    def add_paragraph(self, text: str) -> None:
        if text.strip():
            self.paragraphs.append(text.strip())

    def add_table(self, rows: list[list[str]], number: int) -> None:
        self._flush()
        self.sections.append(
            Section(location=f"{self.location}, table {number}", text=table_to_text(rows), table=rows)
        )

    def finish(self) -> list[Section]:
        self._flush()
        return self.sections

    def _flush(self) -> None:
        if self.paragraphs or self.heading_pending:
            title = self.title if self.heading_pending else None
            level = self.level if self.heading_pending else 0
            self.sections.append(
                Section(location=self.location, text="\n".join(self.paragraphs), title=title, level=level)
            )
        self.paragraphs = []
        self.heading_pending = False
