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


def write_scanned_pdf(path: Path, pages: list[str] = PAGES[:2]) -> Path:
    """A PDF whose pages are pictures of text (as a scanner makes them): no text layer to extract."""
    from PIL import Image, ImageDraw

    images = []
    for text in pages:
        image = Image.new("RGB", (620, 877), "white")  # A4 at 75 dpi
        ImageDraw.Draw(image).multiline_text((40, 60), text.replace(". ", ".\n"), fill="black")
        images.append(image)
    images[0].save(path, "PDF", resolution=75.0, save_all=True, append_images=images[1:])
    return path
