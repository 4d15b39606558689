"""XLSX through openpyxl: each sheet is a table of cached values, with its formulas beside it.

openpyxl never computes formulas: the values are the ones Excel (or LibreOffice) cached when it
last saved the file. A workbook written by a program that does not compute has no cached values,
and those cells read as empty while `formulas` still shows what they would compute.
"""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path
from typing import Any

from app.studio.documents.detect import check_unzipped_size
from app.studio.documents.model import DocumentError, Section, table_to_text

MAX_CELLS = 2_000_000  # of a sheet's used range: its table of strings takes ~100 MB


def format_cell(value: object) -> str:
    """A cell value as the text a reader of the sheet would see (without number formats)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.15g}"  # Excel shows at most 15 significant digits
    if isinstance(value, dt.datetime):
        return value.date().isoformat() if value.time() == dt.time() else value.isoformat(sep=" ")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    return str(value)


def read_xlsx(path: Path) -> list[Section]:
    """One section per worksheet ("sheet Budget") with the used range as a table."""
    check_unzipped_size(path)
    data = path.read_bytes()
    values_book = _load(path, data, data_only=True)
    formulas_book = _load(path, data, data_only=False)
    try:
        sections = []
        for values_sheet, formulas_sheet in zip(
            values_book.worksheets, formulas_book.worksheets, strict=True
        ):
            formulas, extent = _sheet_formulas(path, formulas_sheet)
            rows = _sheet_rows(path, values_sheet)
            # A formula without a cached value still keeps its cell inside the table.
            table = _trim([[format_cell(value) for value in row] for row in rows], *extent)
            sections.append(
                Section(
                    location=f"sheet {values_sheet.title}",
                    text=table_to_text(table),
                    table=table,
                    formulas=formulas,
                )
            )
        return sections
    except DocumentError:
        raise
    except Exception as exc:  # a damaged sheet fails lazily, in whatever way its XML parser fails
        raise DocumentError(path, f"the Excel workbook is corrupt or unreadable ({exc!r})") from exc
    finally:
        values_book.close()
        formulas_book.close()


def _load(path: Path, data: bytes, data_only: bool) -> object:
    import openpyxl

    try:
        # Bytes, not the path: openpyxl would otherwise judge the file by its extension, and
        # read-only workbooks keep their source open until closed.
        return openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=data_only)
    except Exception as exc:  # openpyxl reports damage as KeyError, BadZipFile, XML errors...
        raise DocumentError(path, f"the Excel workbook is corrupt or unreadable ({exc!r})") from exc


def _sheet_formulas(path: Path, sheet: object) -> tuple[dict[str, str], tuple[int, int]]:
    """Cell reference -> formula, and the (rows, columns) extent the formulas reach."""
    from openpyxl.utils import get_column_letter

    formulas: dict[str, str] = {}
    extent = (0, 0)
    for row_number, row in enumerate(_sheet_rows(path, sheet), start=1):
        for column_number, raw in enumerate(row, start=1):
            formula = getattr(raw, "text", raw)  # ArrayFormula keeps its text in .text
            if isinstance(formula, str) and formula.startswith("="):
                formulas[f"{get_column_letter(column_number)}{row_number}"] = formula
                extent = (max(extent[0], row_number), max(extent[1], column_number))
    return formulas, extent


def _sheet_rows(path: Path, sheet: Any) -> list[tuple[object, ...]]:
    """The sheet's rows up to its last non-empty one, each cut after its last value. Only the cells
    the file holds are read (missing rows come as empty tuples); a sheet whose used range spans more
    than MAX_CELLS (cells at A1 and XFD1048576 make 17 billion) is refused before any table is built."""
    sheet.reset_dimensions()  # read-only sheets trust the stored dimensions, which some writers get wrong
    rows: dict[int, tuple[object, ...]] = {}
    cells = 0
    for number, row in enumerate(sheet.iter_rows(values_only=True), start=1):
        if not row:  # a row the file does not hold: most of a sparse sheet's rows, skipped at once
            continue
        width = next((i for i in range(len(row), 0, -1) if row[i - 1] is not None), 0)
        if width:
            rows[number] = row[:width]
            cells += width
            if cells > MAX_CELLS:
                raise DocumentError(path, f"sheet {sheet.title!r} has more than {MAX_CELLS:,} cells")
    height = max(rows, default=0)
    width = max(map(len, rows.values()), default=0)
    if height * width > MAX_CELLS:
        raise DocumentError(
            path,
            f"sheet {sheet.title!r} spans {height:,} rows by {width:,} columns ({height * width:,} cells), "
            f"more than the {MAX_CELLS:,} this reader takes",
        )
    return [rows.get(number, ()) for number in range(1, height + 1)]


def _trim(table: list[list[str]], min_rows: int = 0, min_columns: int = 0) -> list[list[str]]:
    """Pad rows to one width, then drop trailing empty rows and columns (but keep the minimum)."""
    width = max(max((len(row) for row in table), default=0), min_columns)
    table = [row + [""] * (width - len(row)) for row in table]
    table += [[""] * width for _ in range(min_rows - len(table))]
    while len(table) > min_rows and not any(table[-1]):
        table.pop()
    while width > min_columns and not any(row[width - 1] for row in table):
        width -= 1
    return [row[:width] for row in table]
