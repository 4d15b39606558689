"""Ask a vision model about a PDF's pages: each page rendered (pypdfium2) at the model's own
resolution and sent as an image, one request per page, with progress and cancel; the answer
cites the pages it read.

Qt-free, like doc_qa.py. The loaded client must have vision (`client.vision`, the engine's
ImagePrompter: it turns the rendered page into the model's image input and places it in the
prompt); `doc_qa.supports_vision` says whether it does. `doc_pages.py` picks the pages of a
document set that a question reads and numbers them as citations.
"""

from __future__ import annotations

import asyncio
import functools
import io
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.studio.documents import PageScale, render_pages

if TYPE_CHECKING:
    from app.engine import EngineClient

DEFAULT_PAGE_TOKENS = 160
MIN_PAGE_ANSWER_TOKENS = 16  # a page whose prompt leaves less room than this is refused, naming both numbers
PageProgress = Callable[[int, int, str], None]  # (pages done, pages in all, message)
PageDelta = Callable[[int, str], None]  # (page, new text of its answer)


class PagesCancelled(Exception):
    pass


class PageTooLong(ValueError):
    """One page's image tokens and the question leave no room for an answer in the model's context."""


@dataclass(frozen=True)
class PageAnswer:
    page: int  # 1-based
    text: str
    prompt_tokens: int | None
    completion_tokens: int = 0


@dataclass(frozen=True)
class PagesAnswer:
    document: Path
    question: str
    pages: list[PageAnswer]

    @property
    def text(self) -> str:
        """Each page's answer under its citation: "[page 2] ..."."""
        return "\n\n".join(f"[{self.document.name}, page {p.page}] {p.text.strip()}" for p in self.pages)


def page_scale(client: EngineClient) -> PageScale:
    """Pages at the tower's own resolution: the long edge at its square's side, or the short edge
    when the model cuts elongated images into square crops (pan-and-scan), so that no crop is
    blown up from fewer pixels than the tower sees and none is rendered finer than it can see."""
    config = client.vision.config  # type: ignore[attr-defined]
    return PageScale(int(config.image_size), "short" if getattr(config, "pan_and_scan", None) else "long")


def page_prompt(
    client: EngineClient, question: str, page: int, png: bytes, document: str | None = None
) -> tuple[list[int], list[Any]]:
    """Token ids and image inputs of one page's question (the page image first, as a user turn)."""
    vision = client.vision  # type: ignore[attr-defined]
    image = vision.prepare(png)
    where = f"page {page} of {document}" if document else f"page {page} of a document"
    content = (f"{vision.placeholder}This is {where}. Answer from this page only; if it does not answer "
               f"the question, say so in one sentence. {question.strip()}")
    text = client.chat_template.render([{"role": "user", "content": content}], add_generation_prompt=True)
    text = vision.expand(text, [image])
    tokenizer = client.tokenizer
    bos_id = getattr(tokenizer, "bos_token_id", None)
    bos = tokenizer.id_to_token(bos_id) if bos_id is not None else None
    ids = tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos)), parse_special=True)
    return ids, vision.views([image])


@functools.cache
def _render_thread() -> ThreadPoolExecutor:
    # Our own thread, not the loop's default executor: qasync's default is a QThread pool that Qt
    # warns about when it outlives the application; a ThreadPoolExecutor is joined at exit.
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="page-render")


def png_bytes(image: Any) -> bytes:
    """A rendered page (a PIL image) as PNG bytes, as the vision prompter takes images."""
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


async def ask_pages(
    client: EngineClient,
    document: str | Path,
    question: str,
    progress: PageProgress | None = None,
    cancelled: Callable[[], bool] | None = None,
    max_tokens: int = DEFAULT_PAGE_TOKENS,
    scale: float | PageScale | None = None,
    pages: Sequence[int] | None = None,
    on_delta: PageDelta | None = None,
) -> PagesAnswer:
    """The model's answer for each page of the PDF (or the 1-based `pages`), in order. Pages are
    rendered at `scale` (a dpi or a PageScale; default: the model's resolution, `page_scale`) off
    the event loop. PagesCancelled when `cancelled` turns true between pages; DocumentError for a
    file that cannot be rendered; PageTooLong when a page's prompt leaves no room for an answer."""
    from app.engine import GenerationRequest, SamplingParams

    if getattr(client, "vision", None) is None:
        raise ValueError("the loaded model has no vision: it cannot read pages as images")
    report = progress or (lambda done, total, message: None)
    document = Path(document)
    scale = scale if scale is not None else page_scale(client)
    numbers = list(pages) if pages is not None else None
    loop = asyncio.get_running_loop()  # rendering runs PDFium in a child process: not on the loop's thread
    images = await loop.run_in_executor(
        _render_thread(), lambda: render_pages(document, dpi=scale, pages=numbers, cancel=cancelled))
    numbers = numbers or list(range(1, len(images) + 1))
    stops = list(getattr(client.chat_template, "stop_strings", ()) or ())
    context = client.model.context_length
    answers = []
    for done, (number, image) in enumerate(zip(numbers, images, strict=True)):
        if cancelled is not None and cancelled():
            raise PagesCancelled(f"stopped after {done} of {len(images)} pages")
        report(done, len(images), f"Reading page {number} of {document.name} ({done + 1} of {len(images)})…")
        ids, views = page_prompt(client, question, number, png_bytes(image), document.name)
        room = context - len(ids)
        if room < MIN_PAGE_ANSWER_TOKENS:
            raise PageTooLong(f"page {number} of {document.name} and the question take {len(ids)} tokens, and "
                              f"the model's context holds {context}: load the model with a longer context.")
        params = SamplingParams(max_tokens=min(max_tokens, room), temperature=0.0, stop=stops)
        request = GenerationRequest(ids, params, session_id="documents", images=views)
        text, prompt_tokens, completion_tokens = "", None, 0
        async for output in client.generate(request):
            text += output.new_text
            prompt_tokens, completion_tokens = output.num_prompt_tokens, output.num_output_tokens
            if output.new_text and on_delta is not None:
                on_delta(number, output.new_text)
        answers.append(PageAnswer(number, text, prompt_tokens, completion_tokens))
    report(len(images), len(images), "Done")
    return PagesAnswer(document, question, answers)
