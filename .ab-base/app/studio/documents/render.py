"""A `Document` as plain text, Markdown or JSON: what `paddock extract` prints and prompts embed."""

from __future__ import annotations

import json

from app.studio.documents.model import Document, Section

FORMATS = ("text", "markdown", "json")


def to_text(document: Document) -> str:
    """Each section under a `[location]` line, so a model can cite where text came from."""
    blocks = []
    for section in document.sections:
        blocks.append(f"[{section.location}]\n{section.text}".rstrip())
    return "\n\n".join(blocks) + "\n"


def to_markdown(document: Document) -> str:
    blocks = []
    for section in document.sections:
        heading = _markdown_heading(document, section)
        if heading:
            blocks.append(heading)
        if section.table:
            blocks.append(markdown_table(section.table))
        elif section.text:
            blocks.append(section.text)
        if section.formulas:
            blocks.append(
                "Formulas: " + ", ".join(f"{cell} `{formula}`" for cell, formula in section.formulas.items())
            )
    return "\n\n".join(blocks) + "\n"


def to_json(document: Document) -> str:
    payload = {
        "path": str(document.path),
        "kind": document.kind,
        "page_count": document.page_count,
        "sections": [
            {
                "location": section.location,
                "title": section.title,
                "level": section.level,
                "text": section.text,
                "table": section.table,
                "formulas": section.formulas,
            }
            for section in document.sections
        ],
    }
    return json.dumps(payload, ensure_ascii=False, indent=2) + "\n"


RENDERERS = {"text": to_text, "markdown": to_markdown, "json": to_json}


def render_document(document: Document, fmt: str) -> str:
    if fmt not in RENDERERS:
        raise ValueError(f"unknown output format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return RENDERERS[fmt](document)


def markdown_table(rows: list[list[str]]) -> str:
    """A GitHub-style pipe table; the first row is the header."""
    width = max(len(row) for row in rows)
    cells = [[_escape_cell(cell) for cell in row] + [""] * (width - len(row)) for row in rows]
    lines = ["| " + " | ".join(cells[0]) + " |", "|" + " --- |" * width]
    lines += ["| " + " | ".join(row) + " |" for row in cells[1:]]
    return "\n".join(lines)


def _markdown_heading(document: Document, section: Section) -> str | None:
    if section.title:
        return "#" * min(section.level or 1, 6) + " " + section.title
    if document.kind == "pdf":
        return f"## Page {section.location.removeprefix('page ')}"
    if document.kind == "xlsx":
        return f"## Sheet {section.location.removeprefix('sheet ')}"
    return None


def _escape_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")
