"""Plain text and Markdown: decoded with a fallback, cut into located sections."""

from __future__ import annotations

import re
from pathlib import Path

from app.studio.documents.model import DocumentError, Section
from app.studio.documents.outline import OutlineBuilder

LINES_PER_SECTION = 50  # plain text has no structure; citations point at line ranges
_ATX_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def decode_text(path: Path, data: bytes) -> str:
    """UTF-8 (with or without BOM), UTF-16 with a BOM, else Windows-1252, which accepts almost any byte."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    if b"\x00" in data[:8192]:
        raise DocumentError(path, "the file is binary, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace")


def read_text(path: Path) -> list[Section]:
    """Sections of up to LINES_PER_SECTION lines, located as "lines 51-100"."""
    lines = decode_text(path, path.read_bytes()).splitlines()
    sections = []
    for first in range(0, len(lines), LINES_PER_SECTION):
        block = lines[first : first + LINES_PER_SECTION]
        text = "\n".join(line.rstrip() for line in block).strip()
        if text:
            last = first + len(block)
            sections.append(Section(location=f"lines {first + 1}-{last}", text=text))
    return sections


def read_markdown(path: Path) -> list[Section]:
    """A section per ATX heading (`## Title`), as in a DOCX; headings inside code fences are text."""
    builder = OutlineBuilder()
    paragraph: list[str] = []
    in_fence = False
    for line in decode_text(path, path.read_bytes()).splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        heading = None if in_fence else _ATX_HEADING.match(line)
        if heading:
            builder.add_paragraph("\n".join(paragraph))
            paragraph = []
            builder.start_heading(heading.group(2), len(heading.group(1)))
        elif not line.strip() and not in_fence:
            builder.add_paragraph("\n".join(paragraph))
            paragraph = []
        else:
            paragraph.append(line.rstrip())
    builder.add_paragraph("\n".join(paragraph))
    return builder.finish()
