"""Extraction on files this module writes itself, with known text, tables and numbers."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest

from app.cli import main as paddock
from app.studio.documents import (
    DocumentError,
    extract_document,
    parse_page_spec,
    render_pages,
    to_markdown,
    to_text,
)

PAGE_SENTENCES = [
    "The first page talks about apples.",
    "The second page lists the prices.",
    "The third page ends with pears.",
]
PRICE_TABLE = [("Item", "Cost"), ("Apples", "3.50"), ("Pears", "4.25")]


def write_pdf(path: Path, password: str | None = None) -> Path:
    from fpdf import FPDF
    from fpdf.enums import EncryptionMethod

    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    for number, sentence in enumerate(PAGE_SENTENCES, start=1):
        pdf.add_page()
        pdf.multi_cell(w=0, text=f"Page marker {number}. {sentence}")
        if number == 2:
            with pdf.table() as table:
                for cells in PRICE_TABLE:
                    row = table.row()
                    for cell in cells:
                        row.cell(cell)
    if password:
        pdf.set_encryption(
            owner_password="owner", user_password=password, encryption_method=EncryptionMethod.RC4
        )
    pdf.output(str(path))
    return path


def write_docx(path: Path) -> Path:
    import docx

    document = docx.Document()
    document.add_paragraph("Written before any heading.")
    document.add_heading("Intro", level=1)
    document.add_paragraph("Paddock reads Word files.")
    document.add_paragraph("A second paragraph in the intro.")
    table = document.add_table(rows=3, cols=2)
    for row_index, cells in enumerate([("Name", "Score"), ("Ada", "42"), ("Grace", "37")]):
        for column_index, text in enumerate(cells):
            table.cell(row_index, column_index).text = text
    document.add_heading("Method details", level=2)
    document.add_paragraph("Nested under the intro.")
    document.save(str(path))
    return path


def write_xlsx(path: Path) -> Path:
    """Two sheets with numbers and formulas; the formulas' cached values are written into the XML.

    openpyxl stores formulas with an empty cached value (it never computes them), so a real
    spreadsheet program's cache is imitated by filling in `<v>` by hand.
    """
    import openpyxl

    workbook = openpyxl.Workbook()
    budget = workbook.active
    budget.title = "Budget"
    budget.append(["Item", "Cost"])
    budget.append(["Rent", 1200])
    budget.append(["Food", 350.5])
    budget["A4"] = "Total"
    budget["B4"] = "=SUM(B2:B3)"
    notes = workbook.create_sheet("Notes")
    notes["B3"] = "Count"
    notes["C3"] = 7
    notes["C4"] = "=C3*2"
    notes["C5"] = "=C3+100"  # left without a cached value: reads as empty, formula still known
    workbook.save(str(path))
    cached = {"SUM(B2:B3)": "1550.5", "C3*2": "14"}
    with zipfile.ZipFile(path) as archive:
        parts = {name: archive.read(name) for name in archive.namelist()}
    for name in ("xl/worksheets/sheet1.xml", "xl/worksheets/sheet2.xml"):
        xml = parts[name].decode()
        for formula, value in cached.items():
            xml = xml.replace(f"<f>{formula}</f><v></v>", f"<f>{formula}</f><v>{value}</v>")
        parts[name] = xml.encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in parts.items():
            archive.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("documents")
    return {
        "pdf": write_pdf(folder / "report.pdf"),
        "encrypted": write_pdf(folder / "secret.pdf", password="opensesame"),
        "docx": write_docx(folder / "notes.docx"),
        "xlsx": write_xlsx(folder / "budget.xlsx"),
    }


# --- PDF ---------------------------------------------------------------------------------------


def test_pdf_text_per_page_with_locations(files: dict[str, Path]) -> None:
    document = extract_document(files["pdf"])
    assert document.kind == "pdf"
    assert document.page_count == 3
    assert [section.location for section in document.sections] == ["page 1", "page 2", "page 3"]
    for number, (section, sentence) in enumerate(
        zip(document.sections, PAGE_SENTENCES, strict=True), start=1
    ):
        assert f"Page marker {number}." in section.text
        assert sentence in section.text
    # The table's cells come out on page 2 in reading order, and nowhere else.
    page_two = document.sections[1].text
    assert re.search(r"Item\s+Cost\s+Apples\s+3\.50\s+Pears\s+4\.25", page_two)
    assert "Apples" not in document.sections[0].text + document.sections[2].text


def test_pdf_page_selection(files: dict[str, Path]) -> None:
    document = extract_document(files["pdf"], pages=[3, 1])
    assert [section.location for section in document.sections] == ["page 3", "page 1"]
    assert document.page_count == 3
    with pytest.raises(DocumentError, match=r"report\.pdf: page 4 does not exist; the PDF has 3 page"):
        extract_document(files["pdf"], pages=[4])


def test_pdf_pages_render_at_the_requested_dpi(files: dict[str, Path]) -> None:
    images = render_pages(files["pdf"], dpi=144, pages=[2])
    assert len(images) == 1
    image = images[0]
    # fpdf's default page is A4: 210 x 297 mm = 595.3 x 841.9 points, i.e. 8.27 x 11.69 inches.
    assert image.mode == "RGB"
    assert abs(image.width - 595.28 * 2) <= 2 and abs(image.height - 841.89 * 2) <= 2
    darkest, _ = image.convert("L").getextrema()
    assert darkest < 100  # the text was drawn, not a blank page
    assert len(render_pages(files["pdf"], dpi=36)) == 3
    with pytest.raises(ValueError, match="dpi"):
        render_pages(files["pdf"], dpi=5000)


def test_encrypted_pdf_needs_its_password(files: dict[str, Path]) -> None:
    with pytest.raises(DocumentError, match=r"secret\.pdf: the PDF is encrypted and needs a password"):
        extract_document(files["encrypted"])
    with pytest.raises(DocumentError, match="password given is wrong"):
        extract_document(files["encrypted"], password="nope")
    document = extract_document(files["encrypted"], password="opensesame")
    assert PAGE_SENTENCES[0] in document.sections[0].text


def test_corrupt_pdf_is_named(files: dict[str, Path], tmp_path: Path) -> None:
    truncated = tmp_path / "broken.pdf"
    truncated.write_bytes(files["pdf"].read_bytes()[:600])
    with pytest.raises(DocumentError, match=r"broken\.pdf: the PDF is corrupt or unreadable"):
        extract_document(truncated)
    fake = tmp_path / "fake.pdf"
    fake.write_text("just words")
    with pytest.raises(DocumentError, match=r"fake\.pdf: not a valid PDF file"):
        extract_document(fake)


# --- DOCX --------------------------------------------------------------------------------------


def test_docx_headings_paragraphs_and_tables_in_order(files: dict[str, Path]) -> None:
    document = extract_document(files["docx"])
    assert document.kind == "docx"
    summary = [(section.location, section.title, section.level) for section in document.sections]
    assert summary == [
        ("start of document", None, 0),
        ("section Intro", "Intro", 1),
        ("section Intro, table 1", None, 0),
        ("section Method details", "Method details", 2),
    ]
    preamble, intro, table, details = document.sections
    assert preamble.text == "Written before any heading."
    assert intro.text == "Paddock reads Word files.\nA second paragraph in the intro."
    assert table.table == [["Name", "Score"], ["Ada", "42"], ["Grace", "37"]]
    assert table.text == "Name\tScore\nAda\t42\nGrace\t37"
    assert details.text == "Nested under the intro."


def test_docx_markdown_keeps_heading_levels_and_table(files: dict[str, Path]) -> None:
    markdown = to_markdown(extract_document(files["docx"]))
    assert "# Intro\n\nPaddock reads Word files." in markdown
    assert "## Method details\n\nNested under the intro." in markdown
    assert "| Name | Score |\n| --- | --- |\n| Ada | 42 |\n| Grace | 37 |" in markdown


def test_not_really_docx(files: dict[str, Path], tmp_path: Path) -> None:
    plain = tmp_path / "letter.docx"
    plain.write_text("I am not a zip")
    with pytest.raises(DocumentError, match=r"letter\.docx: not a valid DOCX file"):
        extract_document(plain)
    renamed = tmp_path / "renamed.docx"
    renamed.write_bytes(files["pdf"].read_bytes())
    with pytest.raises(DocumentError, match=r"renamed\.docx: not a valid DOCX file: its content is a PDF"):
        extract_document(renamed)
    wrong_zip = tmp_path / "archive.docx"
    with zipfile.ZipFile(wrong_zip, "w") as archive:
        archive.writestr("hello.txt", "hi")
    with pytest.raises(DocumentError, match="ZIP archive without the parts"):
        extract_document(wrong_zip)
    damaged = tmp_path / "damaged.docx"
    with zipfile.ZipFile(files["docx"]) as source, zipfile.ZipFile(damaged, "w") as archive:
        for name in source.namelist():
            data = b"<w:document broken" if name == "word/document.xml" else source.read(name)
            archive.writestr(name, data)
    with pytest.raises(DocumentError, match=r"damaged\.docx: the Word document is corrupt or unreadable"):
        extract_document(damaged)
    legacy = tmp_path / "protected.docx"
    legacy.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 512)
    with pytest.raises(DocumentError, match="password-protected or in the old binary Office format"):
        extract_document(legacy)


# --- XLSX --------------------------------------------------------------------------------------


def test_xlsx_sheets_as_tables_with_cached_formula_values(files: dict[str, Path]) -> None:
    document = extract_document(files["xlsx"])
    assert document.kind == "xlsx"
    budget, notes = document.sections
    assert budget.location == "sheet Budget"
    assert budget.table == [["Item", "Cost"], ["Rent", "1200"], ["Food", "350.5"], ["Total", "1550.5"]]
    assert budget.formulas == {"B4": "=SUM(B2:B3)"}
    assert "Total\t1550.5" in budget.text
    assert notes.location == "sheet Notes"
    # The grid starts at A1 so cell references stay meaningful; C5 has no cached value.
    assert notes.table == [["", "", ""], ["", "", ""], ["", "Count", "7"], ["", "", "14"], ["", "", ""]]
    assert notes.formulas == {"C4": "=C3*2", "C5": "=C3+100"}


def test_xlsx_markdown_lists_formulas(files: dict[str, Path]) -> None:
    markdown = to_markdown(extract_document(files["xlsx"]))
    assert "## Sheet Budget\n\n| Item | Cost |" in markdown
    assert "| Total | 1550.5 |" in markdown
    assert "B4 `=SUM(B2:B3)`" in markdown


def test_corrupt_xlsx(tmp_path: Path, files: dict[str, Path]) -> None:
    broken = tmp_path / "broken.xlsx"
    broken.write_bytes(files["xlsx"].read_bytes()[:300])
    with pytest.raises(DocumentError, match=r"broken\.xlsx: not a valid XLSX file: .*corrupt or truncated"):
        extract_document(broken)


# --- text and Markdown ---------------------------------------------------------------------------


def test_text_file_sections_are_line_ranges(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    path.write_text("\n".join(f"line number {index}" for index in range(1, 121)) + "\n")
    document = extract_document(path)
    assert document.kind == "text"
    assert [section.location for section in document.sections] == [
        "lines 1-50",
        "lines 51-100",
        "lines 101-120",
    ]
    assert document.sections[1].text.splitlines()[0] == "line number 51"
    assert to_text(document).startswith("[lines 1-50]\nline number 1\n")


def test_text_file_encodings(tmp_path: Path) -> None:
    utf8 = tmp_path / "utf8.txt"
    utf8.write_bytes("\ufeffCafé crème".encode())
    assert extract_document(utf8).sections[0].text == "Café crème"
    legacy = tmp_path / "legacy.txt"
    legacy.write_bytes("Café – crème".encode("cp1252"))
    assert extract_document(legacy).sections[0].text == "Café – crème"
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\x00\x01\x02binary")
    with pytest.raises(DocumentError, match=r"binary\.txt: the file is binary"):
        extract_document(binary)


def test_markdown_headings(tmp_path: Path) -> None:
    path = tmp_path / "readme.md"
    path.write_text(
        "Intro line.\n\n# Setup\n\nRun make.\n\n```\n# not a heading\n```\n\n## Tests ##\nRun pytest.\n"
    )
    document = extract_document(path)
    summary = [(section.location, section.level) for section in document.sections]
    assert summary == [("start of document", 0), ("section Setup", 1), ("section Tests", 2)]
    assert "# not a heading" in document.sections[1].text
    assert document.sections[2].text == "Run pytest."


# --- refusals ----------------------------------------------------------------------------------


def test_refusals_name_the_file_and_the_problem(tmp_path: Path, files: dict[str, Path]) -> None:
    empty = tmp_path / "empty.pdf"
    empty.touch()
    with pytest.raises(DocumentError, match=r"empty\.pdf: the file is empty"):
        extract_document(empty)
    with pytest.raises(DocumentError, match=r"report\.pdf: the file is too large \(.* the limit is 1,000\)"):
        extract_document(files["pdf"], max_bytes=1000)
    unknown = tmp_path / "picture.xyz"
    unknown.write_text("hello")
    with pytest.raises(DocumentError, match=r"picture\.xyz: unknown format '\.xyz'; supported: .*\.docx"):
        extract_document(unknown)
    with pytest.raises(DocumentError, match=r"missing\.pdf: file not found"):
        extract_document(tmp_path / "missing.pdf")
    with pytest.raises(DocumentError, match="selecting pages works only for PDF"):
        extract_document(files["docx"], pages=[1])
    with pytest.raises(DocumentError, match="only PDF pages can be rendered"):
        render_pages(files["docx"])


def test_unknown_extension_is_read_by_content(tmp_path: Path, files: dict[str, Path]) -> None:
    download = tmp_path / "download.bin"
    download.write_bytes(files["docx"].read_bytes())
    assert extract_document(download).kind == "docx"


def test_parse_page_spec() -> None:
    assert parse_page_spec("1-3,5").resolve(Path("a.pdf"), 10) == [1, 2, 3, 5]
    assert parse_page_spec("4, 2-3, 3").resolve(Path("a.pdf"), 10) == [4, 2, 3]
    for bad in ("", "0", "3-1", "a", "1-", "1,,2"):
        with pytest.raises(ValueError, match="bad page"):
            parse_page_spec(bad)


# --- paddock extract ---------------------------------------------------------------------------


def test_extract_command_prints_json(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert paddock(["extract", str(files["pdf"]), "--pages", "2-3", "--format", "json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["kind"] == "pdf" and payload["page_count"] == 3
    assert [section["location"] for section in payload["sections"]] == ["page 2", "page 3"]
    assert "Pears" in payload["sections"][0]["text"]


def test_extract_command_reports_errors(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert paddock(["extract", str(files["encrypted"])]) == 1
    assert "secret.pdf: the PDF is encrypted" in capsys.readouterr().err


def test_extract_command_writes_page_images(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "pages"
    assert paddock(["extract", str(files["pdf"]), "--pages", "1,3", "--images", str(out), "--dpi", "30"]) == 0
    assert sorted(path.name for path in out.iterdir()) == ["page-0001.png", "page-0003.png"]
