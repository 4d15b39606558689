"""`paddock extract FILE`: print the text the Studio sees in a PDF, DOCX, XLSX, TXT or Markdown file."""

from __future__ import annotations

import argparse
import sys

HELP = "Print the text the Studio extracts from a PDF, DOCX, XLSX, TXT or Markdown file."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the document to read")
    parser.add_argument("--pages", help="PDF pages to read, 1-based, e.g. 1-3,5 (default: all)")
    parser.add_argument(
        "--format", choices=("text", "markdown", "json"), default="text", help="output format (default: text)"
    )
    parser.add_argument("--password", help="password of an encrypted PDF")
    parser.add_argument("--images", metavar="DIR", help="also render the PDF pages as PNG files into DIR")
    parser.add_argument("--dpi", type=float, default=150, help="resolution of --images (default: 150)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from app.studio.documents import (
        DocumentError,
        extract_document,
        parse_page_spec,
        render_document,
        render_pages,
    )

    try:
        pages = parse_page_spec(args.pages) if args.pages else None
        document = extract_document(args.file, pages=pages, password=args.password)
        sys.stdout.write(render_document(document, args.format))
        if args.images:
            folder = Path(args.images)
            folder.mkdir(parents=True, exist_ok=True)
            count = document.page_count or 0
            numbers = pages.resolve(Path(args.file), count) if pages else list(range(1, count + 1))
            images = render_pages(args.file, dpi=args.dpi, pages=numbers, password=args.password)
            for number, image in zip(numbers, images, strict=True):
                image.save(folder / f"page-{number:04d}.png")
            print(f"wrote {len(images)} page image(s) to {folder}", file=sys.stderr)
    except (DocumentError, ValueError, OSError) as exc:
        print(f"paddock extract: error: {exc}", file=sys.stderr)
        return 1
    return 0
