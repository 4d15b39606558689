"""Small documents the document Q&A tests write: a three-page PDF with known facts and a two-section DOCX."""

from __future__ import annotations

from pathlib import Path

PAGES = [
    "The festival report. The Paddock festival takes place in Lyon on the fourteenth of June.",
    "Tickets for adults cost twelve euros. Children enter free of charge.",
    "Pears cost four dollars per kilogram at the orchard market.",
]


def write_pdf(path: Path, pages: list[str] = PAGES) -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(w=0, text=text)
    pdf.output(str(path))
    return path


def write_docx(path: Path) -> Path:
    import docx

    document = docx.Document()
    document.add_heading("Travel", level=1)
    document.add_paragraph("The team travels to Lyon by train.")
    document.add_heading("Meals", level=1)
    document.add_paragraph("Lunch is served at noon in the market hall.")
    document.save(str(path))
    return path
