"""A document set's PDF pages for a vision model: which pages a question reads, numbered as the
answer's citations, and their answers streamed page after page (page_qa.ask_pages).

Every page of the set's PDFs goes when there are at most `MAX_PAGES`; past that, the pages whose
text the question is most similar to come first, then the pages of scanned PDFs (no text to rank
them by), then the rest in order. The answer is each page's reply under its citation number, so
the Documents pane links and lists pages as it does text excerpts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.studio.page_qa import PageProgress, ask_pages
from app.studio.retrieval import Chunk, Citation, Hit

if TYPE_CHECKING:
    from app.engine import EngineClient
    from app.studio.doc_qa import DocumentSet  # doc_qa imports this module: a type only, no cycle

MAX_PAGES = 12  # one request per page: a long PDF is read by its most relevant pages


def page_citations(documents: DocumentSet, question: str, limit: int = MAX_PAGES) -> list[Citation]:
    """The pages the question reads, in document and page order, numbered from 1."""
    pdfs = [d for d in documents.documents if d.kind == "pdf" and d.page_count]
    every = [(str(d.path), page) for d in pdfs for page in range(1, (d.page_count or 0) + 1)]
    if len(every) <= limit:
        chosen = set(every)
    else:
        ranked = [(c.hit.chunk.source, _page_of(c.hit.chunk.location)) for c in documents.retrieve(question, 4 * limit)]
        scanned = [(str(d.path), page) for d in pdfs if d.scanned for page in range(1, (d.page_count or 0) + 1)]
        known, chosen = set(every), set()
        for ref in [*ranked, *scanned, *every]:
            if len(chosen) == limit:
                break
            if ref in known:
                chosen.add(ref)
    ordered = [ref for ref in every if ref in chosen]
    return [
        Citation(number, Hit(Chunk(documents.passage(source, f"page {page}"), source, f"page {page}", 0), 1.0),
                 image=True)
        for number, (source, page) in enumerate(ordered, start=1)
    ]


def total_pages(documents: DocumentSet) -> int:
    return sum(d.page_count or 0 for d in documents.documents if d.kind == "pdf")


async def stream_pages(
    client: EngineClient,
    question: str,
    citations: list[Citation],
    state: Any,  # doc_qa._Streamed: text and token counts, kept as they arrive
    on_delta: Callable[[str], None] | None = None,
    progress: PageProgress | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> None:
    """Each cited page to the model as an image; its answer streams under "[n] "."""
    emit = on_delta or (lambda text: None)
    done, total = 0, len(citations)
    for source, group in _by_document(citations):
        numbers = {_page_of(c.hit.chunk.location): c.number for c in group}
        started: set[int] = set()

        def delta(page: int, text: str, numbers: dict[int, int] = numbers, started: set[int] = started) -> None:
            if page not in started:
                started.add(page)
                opening = f"{chr(10) * 2 if state.text else ''}[{numbers[page]}] "
                state.text += opening
                emit(opening)
            state.text += text
            emit(text)

        def report(page_done: int, page_total: int, message: str, base: int = done) -> None:
            if progress is not None and page_done < page_total:  # one document's "Done" is not the answer's
                progress(base + page_done, total, message)

        answer = await ask_pages(client, source, question, progress=report, cancelled=cancelled,
                                 pages=sorted(numbers), on_delta=delta)
        for page in answer.pages:
            state.prompt_tokens = (state.prompt_tokens or 0) + (page.prompt_tokens or 0)
            state.completion_tokens += page.completion_tokens
            if page.page not in started:  # a page whose answer was empty still shows its citation
                delta(page.page, "(no answer)")
        done += len(group)


def _by_document(citations: list[Citation]) -> list[tuple[Path, list[Citation]]]:
    groups: dict[str, list[Citation]] = {}
    for citation in citations:
        groups.setdefault(citation.hit.chunk.source, []).append(citation)
    return [(Path(source), group) for source, group in groups.items()]


def _page_of(location: str) -> int:
    return int(location.removeprefix("page ")) if location.startswith("page ") and location[5:].isdigit() else 0
