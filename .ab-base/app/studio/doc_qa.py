"""Document Q&A: files in, a retrieval index, and answers that cite the page, sheet or section they come from.

Qt-free. Two parts:

- `DocumentSet` owns the ingested files and their `DocumentIndex`. `ingest` reads files
  (`extract_document`), chunks and embeds them (`ingest_documents`) with progress and
  cancel; it runs on a worker thread while questions are answered on the UI's loop, so
  the index is only touched under a lock and new chunks arrive all at once.
- `DocQASession` answers one question at a time: retrieve the most relevant chunks,
  number them [1]..[n] under their citations ("report.pdf, page 3"), and stream the
  answer from the local `EngineClient`, as `ChatService` streams a chat answer.

A model with vision (`supports_vision`: Gemma 3 with its tower) reads the set's PDFs as page
images instead, page by page (doc_pages.py over `page_qa.ask_pages`), each page a citation; the
other documents' excerpts follow as text, numbered after the pages. A set that keeps scanned PDFs
(`keep_scanned`: no text layer, nothing to search) holds them for such a model; a text-only model
is told plainly that it cannot read them (`needs_vision_message`). With an OCR model (`ocr`, ocr.py:
PaddleOCR-VL) the pages without a text layer are read by it as they are ingested, and are then
searched and cited by page like any text page.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from app.studio.documents import (
    Document,
    DocumentError,
    ExtractionCancelled,
    extract_document,
    supported_extensions,
)
from app.studio.embedders import EmbedderSource, default_embedder
from app.studio.ocr import OcrHost, read_scanned_pages, textless_pages
from app.studio.remote_engine import RemoteEngine
from app.studio.retrieval import (
    Chunk,
    Citation,
    DocumentIndex,
    Embedder,
    IngestCancelled,
    build_question_prompt,
    embed_query,
    ingest_documents,
)

if TYPE_CHECKING:
    from app.engine import EngineClient

DEFAULT_TOP_K = 4
DEFAULT_ANSWER_TOKENS = 256
# Excerpts less similar to the question than this (cosine, all-MiniLM-L6-v2) are not sent: unrelated
# text scores about 0.0-0.1 with it, a passage on the question's subject 0.3 and above.
MIN_RELEVANCE = 0.15
MIN_ANSWER_TOKENS = 32  # excerpts are dropped (least relevant first) until at least this much room is left
READ_SHARE = 20.0  # percent of the progress bar for reading files; embedding takes the rest
DOCUMENT_EXTENSIONS = frozenset(supported_extensions())
# "[1]", "[2, 3]", "[1][4]": the excerpt numbers an answer refers to
_CITE = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")

IngestProgress = Callable[[float, float, str], None]  # (done, total, message), as TaskContext.report takes
AnswerProgress = Callable[[int, int, str], None]  # (pages read, pages to read, message)
# What a user without a vision model is told to do about a scanned PDF (the Models pane downloads a
# GGUF's mmproj companion with it, which gives the model its vision).
GET_VISION = ("Load a model with vision: in the Models pane, download a Gemma 3 GGUF together with its mmproj "
              "file (e.g. ggml-org/gemma-3-4b-it-GGUF) and load it.")
CancelCheck = Callable[[], bool]


class DocQAError(Exception):
    """A question cannot be answered yet; the message is meant for the user."""


def is_document_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() in DOCUMENT_EXTENSIONS


def embedder_source(path: str, device: str = "auto") -> EmbedderSource:
    """The Studio's embedder setting as a source: "" the shipped MiniLM; a Qwen3-Embedding folder or
    .gguf (its own engine beside the chat model) or a sentence-transformers BERT folder."""
    if not path:
        return default_embedder

    def load() -> Embedder:
        from app.engine.embeddings import BertEmbedder
        from app.engine.tasks.task_model import is_decoder_model, load_decoder_embedder

        if is_decoder_model(path):
            return load_decoder_embedder(path, device=device)
        return BertEmbedder.from_dir(path)

    return load


def supports_vision(client: EngineClient | None) -> bool:
    """Whether the loaded model reads images (its ModelInfo.supports_vision: a vision tower is loaded)."""
    return client is not None and bool(getattr(client.model, "supports_vision", False))


class _Named(Protocol):
    @property
    def name(self) -> str: ...


def needs_vision_message(scanned: Sequence[_Named]) -> str:
    """One plain sentence for a text-only model: these PDFs (documents or paths: their names are used) are
    images of pages, and how to read them. The Chat pane says the same of a scanned PDF attached there."""
    names = ", ".join(d.name for d in scanned)
    verb = "has" if len(scanned) == 1 else "have"
    return f"{names} {verb} no text layer (scanned pages): a vision model is needed to read them. {GET_VISION}"


@dataclass(frozen=True)
class IngestedDocument:
    path: Path
    kind: str  # "pdf" | "docx" | "xlsx" | "text" | "markdown"
    locations: tuple[str, ...]  # every section's location, in order
    chunks: int
    page_count: int | None = None
    ocr_pages: tuple[int, ...] = ()  # a PDF's pages without a text layer that the OCR model read

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def scanned(self) -> bool:
        """A PDF without a text layer: only a vision model can read it (as page images)."""
        return self.kind == "pdf" and self.chunks == 0

    def describe(self) -> str:
        """What the document holds, for the list: '3 pages', '2 sheets: Budget, Notes', '4 sections'."""
        if self.kind == "pdf" and self.page_count is not None:
            ocr = f", {len(self.ocr_pages)} read by OCR" if self.ocr_pages else ""
            return _plural(self.page_count, "page") + (", scanned (no text layer)" if self.scanned else ocr)
        if self.kind == "xlsx":
            names = [location.removeprefix("sheet ") for location in self.locations]
            return f"{_plural(len(names), 'sheet')}: {', '.join(names)}"
        if self.kind == "text":
            return _plural(len(self.locations), "part")
        return _plural(len(self.locations), "section")


@dataclass(frozen=True)
class IngestFailure:
    path: Path
    message: str  # DocumentError's own: names the file and the problem


@dataclass(frozen=True)
class IngestReport:
    added: list[IngestedDocument]
    failed: list[IngestFailure]


class DocumentSet:
    """The ingested files and their index; safe to ingest on one thread while another retrieves."""

    def __init__(self, embedder: EmbedderSource = default_embedder, top_k: int = DEFAULT_TOP_K,
                 store: Path | None = None, min_relevance: float = MIN_RELEVANCE, keep_scanned: bool = False,
                 ocr: OcrHost | None = None) -> None:
        """`store`: a folder the set is kept in across restarts (document_store.py), loaded here.
        `keep_scanned`: a PDF without text is kept (for a vision model) rather than refused.
        `ocr`: the OCR model that reads PDF pages without a text layer as they are ingested (ocr.py)."""
        self.keep_scanned = keep_scanned
        self.ocr = ocr or OcrHost()
        self._embedder_source = embedder
        self._store, self.min_relevance = store, min_relevance
        self._saved: tuple[list[Chunk], Any] | None = None  # loaded excerpts, indexed once the embedder is up
        self._embedder: Embedder | None = None
        self._embedder_lock = threading.Lock()  # two first uses on two threads load the model once
        self.top_k = top_k
        self._lock = threading.Lock()
        self._index: DocumentIndex | None = None
        self._documents: dict[str, IngestedDocument] = {}
        if store is not None:
            self._load(store)

    @property
    def documents(self) -> list[IngestedDocument]:
        with self._lock:
            return list(self._documents.values())

    @property
    def scanned(self) -> list[IngestedDocument]:
        return [d for d in self.documents if d.scanned]

    @property
    def has_pdfs(self) -> bool:
        return any(d.kind == "pdf" for d in self.documents)

    def __len__(self) -> int:
        with self._lock:
            return len(self._documents)

    def passage(self, source: str | Path, location: str) -> str:
        """The extracted text at one location of a document ("page 3"), its chunks joined; "" when none."""
        with self._lock:
            chunks = self._index.chunks if self._index is not None else (self._saved or ([], None))[0]
            texts = [c.text for c in chunks if c.source == str(source) and c.location == location]
        return _join_overlapping(texts)

    def embedder(self) -> Embedder:
        with self._embedder_lock:
            if self._embedder is None:
                self._embedder = self._embedder_source()
            return self._embedder

    def ingest(self, paths: Sequence[str | Path], progress: IngestProgress | None = None,
               cancel: CancelCheck | None = None) -> IngestReport:
        """Read, chunk and embed `paths`. Files that fail are reported, not raised; the others are added.

        A file ingested again replaces its earlier chunks. Cancelling raises `IngestCancelled`
        (from retrieval) or the caller's own exception, and leaves the set as it was.
        """
        report = progress or (lambda done, total, message: None)
        paths = [Path(path) for path in paths]
        documents: list[Document] = []
        failed: list[IngestFailure] = []
        ocr_pages: dict[str, list[int]] = {}
        for number, path in enumerate(paths):
            _check(cancel)
            report(READ_SHARE * number / len(paths), 100.0, f"Reading {path.name}…")

            def page_read(done: int, total: int, message: str, number: int = number) -> None:
                report(READ_SHARE * (number + done / total) / len(paths), 100.0, message)

            try:
                document = extract_document(path, cancel=cancel)
                document, ocr_pages[str(path)] = self._read_scanned(document, page_read, cancel)
                documents.append(document)
            except ExtractionCancelled:
                raise IngestCancelled("ingestion cancelled") from None
            except DocumentError as exc:
                failed.append(IngestFailure(path, str(exc)))
        if not documents:
            return IngestReport([], failed)
        report(READ_SHARE, 100.0, "Loading the embedding model…")
        embedder = self.embedder()

        def embedded(done: int, total: int) -> None:
            share = (100.0 - READ_SHARE) * done / total if total else 0.0
            report(READ_SHARE + share, 100.0, f"Embedding excerpts: {done} of {total}")

        fresh = ingest_documents(documents, embedder, progress=embedded, cancel=cancel)
        counts: dict[str, int] = {}
        for chunk in fresh.chunks:
            counts[chunk.source] = counts.get(chunk.source, 0) + 1
        added = []
        for document in documents:
            scanned = document.kind == "pdf" and self.keep_scanned
            if not counts.get(str(document.path)) and not scanned:  # e.g. a scanned PDF: no text layer
                failed.append(IngestFailure(document.path, str(DocumentError(
                    document.path, "no text found to search (scanned pages need OCR, which Paddock lacks)"))))
                continue
            added.append(IngestedDocument(document.path, document.kind,
                                          tuple(section.location for section in document.sections),
                                          counts.get(str(document.path), 0), document.page_count,
                                          tuple(ocr_pages.get(str(document.path), ()))))
        with self._lock:
            self._ensure_index(embedder)
            for document in added:
                self._index.remove_source(document.path)
                self._documents.pop(str(document.path), None)
            if len(fresh):
                self._index.add(fresh.chunks, fresh.vectors)
            self._documents.update((str(document.path), document) for document in added)
        self._keep()
        report(100.0, 100.0, "Done")
        return IngestReport(added, failed)

    def _read_scanned(self, document: Document, progress: Callable[[int, int, str], None],
                      cancel: CancelCheck | None) -> tuple[Document, list[int]]:  # fmt: skip
        """A PDF's pages without text read by the OCR model, when one is configured (ocr.py)."""
        if not self.ocr.configured or not textless_pages(document):
            return document, []
        try:
            reader = self.ocr.get()
        except (ValueError, OSError) as exc:  # the model's own errors name its path and the problem
            raise DocumentError(document.path, f"its pages have no text and the OCR model failed to load: {exc}") from None
        if reader is None:  # none installed
            return document, []
        return read_scanned_pages(document, reader, progress, cancel)

    def remove(self, path: str | Path) -> None:
        with self._lock:
            if self._documents.pop(str(path), None) is not None:
                if self._index is not None:
                    self._index.remove_source(path)
                elif self._saved is not None:
                    self._saved = _without_source(self._saved, str(path))
        self._keep()

    def clear(self) -> None:
        with self._lock:
            self._documents.clear()
            self._index, self._saved = None, None
        self._keep()

    def retrieve(self, question: str, k: int | None = None) -> list[Citation]:
        """The k chunks most similar to the question, best first, numbered from 1."""
        if not question.strip():
            raise DocQAError("Type a question first.")
        if not len(self):
            raise DocQAError("Add a document first: drop a PDF, Word, Excel, text or Markdown file.")
        embedder = self.embedder()
        query = embed_query(embedder, question)  # outside the lock: an ingest may be embedding too
        with self._lock:
            self._ensure_index(embedder)
            if self._index is None:
                return []
            hits = self._index.search_vector(query, k or self.top_k)
        relevant = [hit for hit in hits if hit.score >= self.min_relevance]  # unrelated text is not sent
        return [Citation(number, hit) for number, hit in enumerate(relevant, start=1)]

    # -- kept across restarts (with a store folder) -------------------------------------------
    def _ensure_index(self, embedder: Embedder) -> None:
        """Under the lock: the index exists, holding the excerpts loaded from the store if any."""
        if self._index is not None:
            return
        self._index = DocumentIndex(embedder)
        saved, self._saved = self._saved, None
        if saved is not None and len(saved[0]):
            if saved[1].shape[1] != embedder.dimensions:  # embedded by another model: read them again
                self._documents.clear()
                return
            self._index.add(saved[0], saved[1])

    def _load(self, store: Path) -> None:
        from app.studio.document_store import load_documents

        loaded = load_documents(store)
        if loaded is None:
            return
        documents, chunks, vectors = loaded
        for data in documents:
            document = IngestedDocument(Path(data["path"]), data["kind"], tuple(data["locations"]),
                                        int(data["chunks"]), data.get("page_count"),
                                        tuple(int(n) for n in data.get("ocr_pages") or ()))
            self._documents[str(document.path)] = document
        self._saved = (chunks, vectors)

    def _keep(self) -> None:
        if self._store is None:
            return
        import numpy as np

        from app.studio.document_store import save_documents

        with self._lock:
            documents = [{"path": str(d.path), "kind": d.kind, "locations": list(d.locations), "chunks": d.chunks,
                          "page_count": d.page_count, "ocr_pages": list(d.ocr_pages)}
                         for d in self._documents.values()]
            if self._index is not None:
                chunks, vectors = list(self._index.chunks), self._index.vectors
            elif self._saved is not None:
                chunks, vectors = list(self._saved[0]), self._saved[1]
            else:
                chunks, vectors = [], np.zeros((0, 0), dtype=np.float32)
        try:
            save_documents(self._store, documents, chunks, vectors)
        except OSError as exc:  # the set still works for this session; the next change tries again
            logging.getLogger(__name__).warning("could not keep the document set in %s: %s", self._store, exc)


@dataclass(frozen=True)
class DocAnswer:
    question: str
    text: str
    citations: list[Citation]  # the excerpts the model was given
    status: str  # "complete" | "stopped" | "error"
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0

    @property
    def cited(self) -> list[Citation]:
        """The excerpts the answer refers to by number, in the order first cited."""
        return [self.citations[n - 1] for n in cited_numbers(self.text) if 0 < n <= len(self.citations)]


def cited_numbers(text: str) -> list[int]:
    numbers: list[int] = []
    for match in _CITE.finditer(text):
        for part in match.group(1).split(","):
            if int(part) not in numbers:
                numbers.append(int(part))
    return numbers


@dataclass(frozen=True)
class PromptPlan:
    token_ids: list[int]
    primer: str  # the answer's opening, written by us into the prompt: shown as the answer's first words
    stop: list[str]


class DocQASession:
    """Questions over a `DocumentSet`, answered by the loaded model. One answer at a time, on an asyncio loop."""

    def __init__(self, documents: DocumentSet, client: Callable[[], EngineClient | None],
                 max_tokens: int = DEFAULT_ANSWER_TOKENS, temperature: float = 0.0) -> None:
        self.documents = documents
        self._client = client  # asked at each question: models switch
        self.max_tokens = max_tokens
        self.temperature = temperature  # greedy by default: an answer should read its sources, not improvise
        self._stream: asyncio.Task[Any] | None = None

    @property
    def busy(self) -> bool:
        return self._stream is not None and not self._stream.done()

    @property
    def supports_vision(self) -> bool:
        return supports_vision(self._client())

    def stop(self) -> None:
        """End the answer being generated (on the loop's thread); a no-op when idle."""
        self._stopping = True  # a page being rendered off the loop sees it too
        if self._stream is not None and not self._stream.done():
            self._stream.cancel()

    async def ask(self, question: str, on_start: Callable[[list[Citation]], None] | None = None,
                  on_delta: Callable[[str], None] | None = None,
                  on_progress: AnswerProgress | None = None) -> DocAnswer:
        """Answer from the most relevant excerpts, or with a vision model from the PDFs' page images
        (`on_progress` follows the pages). Raises DocQAError when it cannot start."""
        if self.busy:
            raise DocQAError("An answer is still being generated: stop it first.")
        client = self._client()
        if client is None:
            raise DocQAError("No model is loaded: load one in the Models pane.")
        if not question.strip():
            raise DocQAError("Type a question first.")
        if not len(self.documents):
            raise DocQAError("Add a document first: drop a PDF, Word, Excel, text or Markdown file.")
        self._stopping = False
        state = _Streamed()
        if isinstance(client, RemoteEngine):
            citations, work = self._plan_remote(client, question.strip(), state, on_delta)
        elif supports_vision(client) and self.documents.has_pdfs:
            citations, work = self._plan_pages(client, question.strip(), state, on_delta, on_progress)
        else:
            citations, work = self._plan_text(client, question.strip(), state, on_delta)
        if on_start is not None:
            on_start(citations)
        if state.text and on_delta is not None:
            on_delta(state.text)
        self._stream = asyncio.ensure_future(work)
        status, error = "complete", None
        try:
            await self._stream
        except asyncio.CancelledError:
            status = "stopped"
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # we were cancelled, not just the stream
                raise
        except Exception as exc:  # the engine failed mid-answer: keep the text, say what happened
            status, error = "error", str(exc) or type(exc).__name__
        finally:
            self._stream = None
        return DocAnswer(question.strip(), state.text, citations, status, error, state.prompt_tokens,
                         state.completion_tokens)

    def _plan_text(self, client: EngineClient, question: str, state: _Streamed,
                   on_delta: Callable[[str], None] | None) -> tuple[list[Citation], Any]:
        plan, citations = self._fit(client, question, self._relevant(question))
        state.text = plan.primer
        return citations, self._consume(client, self._request(client, plan), state, on_delta)

    def _plan_remote(self, remote: RemoteEngine, question: str, state: _Streamed,
                     on_delta: Callable[[str], None] | None) -> tuple[list[Citation], Any]:
        """A remote engine gets the question and its excerpts as one chat turn (its server fits the context)."""
        citations = self._relevant(question)
        messages = [{"role": "user", "content": build_question_prompt(question, [c.hit for c in citations])}]
        return citations, self._consume_outputs(remote.stream_chat(messages, self.max_tokens, self.temperature),
                                                state, on_delta)

    def _relevant(self, question: str) -> list[Citation]:
        """The excerpts close enough to answer from, or DocQAError saying why there are none."""
        # embedding one short question on the loop's thread takes ~30 ms on a CPU: no worker needed
        citations = self.documents.retrieve(question)
        if not citations:
            scanned = self.documents.scanned
            if scanned and len(scanned) == len(self.documents):  # nothing here is text: say what would read it
                raise DocQAError(needs_vision_message(scanned))
            raise DocQAError("No passage in the documents is close enough to the question to answer from "
                             f"(similarity below {self.documents.min_relevance:.2f}): rephrase it, or add the "
                             "document that answers it.")
        return citations

    def _plan_pages(self, client: EngineClient, question: str, state: _Streamed,
                    on_delta: Callable[[str], None] | None,
                    on_progress: AnswerProgress | None) -> tuple[list[Citation], Any]:
        """The PDFs' pages as images, then the other documents' excerpts as text, numbered after them."""
        from app.studio.doc_pages import page_citations, stream_pages

        pages = page_citations(self.documents, question)
        kinds = {str(d.path): d.kind for d in self.documents.documents}
        texts = []
        if any(kind != "pdf" for kind in kinds.values()):
            hits = self.documents.retrieve(question, 3 * self.documents.top_k)  # some are the PDFs' own text
            texts = [c for c in hits if kinds.get(c.hit.chunk.source) != "pdf"][: self.documents.top_k]
        plan = None
        if texts:
            texts = [Citation(len(pages) + i, c.hit) for i, c in enumerate(texts, start=1)]
            plan, texts = self._fit(client, question, texts)

        async def work() -> None:
            await stream_pages(client, question, pages, state, on_delta, on_progress, lambda: self._stopping)
            if plan is not None:
                opening = ("\n\n" if state.text else "") + plan.primer  # a base model's answer opening, too
                state.text += opening
                if opening and on_delta is not None:
                    on_delta(opening)
                pages_prompt, pages_output = state.prompt_tokens or 0, state.completion_tokens
                await self._consume(client, self._request(client, plan), state, on_delta)
                state.prompt_tokens = pages_prompt + (state.prompt_tokens or 0)
                state.completion_tokens += pages_output

        return [*pages, *texts], work()

    def _request(self, client: EngineClient, plan: PromptPlan) -> Any:
        from app.engine import GenerationRequest, SamplingParams

        room = client.model.context_length - len(plan.token_ids)
        params = SamplingParams(max_tokens=min(self.max_tokens, room), temperature=self.temperature,
                                stop=plan.stop)
        return GenerationRequest(plan.token_ids, params, session_id="documents")

    def _fit(self, client: EngineClient, question: str,
             citations: list[Citation]) -> tuple[PromptPlan, list[Citation]]:
        """The prompt with as many excerpts as leave room for an answer (least relevant dropped first)."""
        context = client.model.context_length
        while True:
            plan = plan_prompt(client, question, citations)
            if context - len(plan.token_ids) >= MIN_ANSWER_TOKENS:
                return plan, citations
            if len(citations) <= 1:
                raise DocQAError(f"The question and its best excerpt take {len(plan.token_ids)} tokens, and "
                                 f"the model's context holds {context}: load the model with a longer context.")
            citations = citations[:-1]

    async def _consume(self, client: EngineClient, request: Any, state: _Streamed,
                       on_delta: Callable[[str], None] | None) -> None:
        await self._consume_outputs(client.generate(request), state, on_delta)

    @staticmethod
    async def _consume_outputs(outputs: Any, state: _Streamed, on_delta: Callable[[str], None] | None) -> None:
        async for output in outputs:
            state.prompt_tokens = output.num_prompt_tokens or state.prompt_tokens
            state.completion_tokens = output.num_output_tokens
            if output.new_text:
                state.text += output.new_text
                if on_delta is not None:
                    on_delta(output.new_text)


@dataclass
class _Streamed:
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int = 0


# A base model (no chat template in its file, so the engine lent it a built-in one) does not
# follow instructions in chat turns: measured on the embedded Gemma 3 270M, it repeats the
# instructions back. As plain text ending in "Answer: According to [" it reads the excerpt
# and names its number. Models that ship their own template get the chat prompt.
COMPLETION_PRIMER = "According to ["


def is_base_model(client: EngineClient) -> bool:
    source = getattr(client.chat_template, "source", "")
    return isinstance(source, str) and source.startswith("builtin:")


def plan_prompt(client: EngineClient, question: str, citations: Sequence[Citation]) -> PromptPlan:
    hits = [citation.hit for citation in citations]
    stops = list(getattr(client.chat_template, "stop_strings", ()) or ())
    if is_base_model(client):
        excerpts = "\n\n".join(f"{c.label}\n{c.text}" for c in citations)
        text = (f"Numbered excerpts from the user's documents:\n\n{excerpts}\n\n"
                f"Question: {question}\nAnswer, citing the excerpt it comes from: {COMPLETION_PRIMER}")
        return PromptPlan(_encode(client, text, raw=True), COMPLETION_PRIMER, [*stops, "\n"])
    first = citations[0].number if citations else 1  # excerpts after a vision answer's pages go on counting
    rendered = client.chat_template.render([{"role": "user", "content": build_question_prompt(question, hits, first)}],
                                           add_generation_prompt=True)
    return PromptPlan(_encode(client, rendered), "", stops)


def chat_message(question: str, citations: Sequence[Citation]) -> str:
    """A chat turn carrying the question and the excerpts of documents dropped on the chat.

    The question comes first: it names the conversation and reads naturally in the transcript.
    """
    excerpts = "\n\n".join(f"{c.label}\n{c.text}" for c in citations)
    return (f"{question.strip()}\n\nAnswer from these excerpts of the attached documents, citing them by "
            f"number in square brackets, e.g. [1]:\n\n{excerpts}")


def _encode(client: EngineClient, text: str, raw: bool = False) -> list[int]:
    """Token ids of a rendered prompt; BOS is added unless the template already wrote it."""
    tokenizer = client.tokenizer
    bos_id = getattr(tokenizer, "bos_token_id", None)
    bos = tokenizer.id_to_token(bos_id) if bos_id is not None else None
    add_bos = raw or not (bos and text.startswith(bos))
    return tokenizer.encode(text, add_special_tokens=add_bos, parse_special=not raw)


def _join_overlapping(texts: Sequence[str]) -> str:
    """Consecutive chunks of one section, their overlap (whole lines: chunks are packed from pieces) once."""
    lines: list[str] = []
    for text in texts:
        new = text.split("\n")
        overlap = next((n for n in range(min(len(lines), len(new)), 0, -1) if lines[-n:] == new[:n]), 0)
        lines += new[overlap:]
    return "\n".join(lines)


def _without_source(saved: tuple[list[Chunk], Any], source: str) -> tuple[list[Chunk], Any]:
    keep = [i for i, chunk in enumerate(saved[0]) if chunk.source != source]
    return [saved[0][i] for i in keep], saved[1][keep]


def _check(cancel: CancelCheck | None) -> None:
    if cancel is not None and cancel():
        raise IngestCancelled("ingestion cancelled")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
