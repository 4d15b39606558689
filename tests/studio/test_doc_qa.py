"""Document Q&A on files written here: real extraction, the real MiniLM embedder, a fake engine that cites.

The generation side uses the API tests' fake engine, whose answer is swapped for one
that names the excerpts its prompt carried, so a test sees exactly what the model was
given; the Studio tests (tests/ui/test_documents_pane.py) run the embedded model itself.
"""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from server import fakes
from server.fakes import FakeEngine
from studio.doc_files import write_docx, write_pdf

from app.studio.doc_qa import (
    COMPLETION_PRIMER,
    DocQAError,
    DocQASession,
    DocumentSet,
    chat_message,
    cited_numbers,
    supports_vision,
)
from app.studio.retrieval import IngestCancelled


def write_xlsx(path: Path) -> Path:
    import openpyxl

    workbook = openpyxl.Workbook()
    budget = workbook.active
    budget.title = "Budget"
    for row in (("Item", "Euros"), ("Stage", 1200), ("Lights", 800)):
        budget.append(row)
    staff = workbook.create_sheet("Staff")
    for row in (("Name", "Role"), ("Ada", "Sound engineer")):
        staff.append(row)
    workbook.save(str(path))
    return path


def citing_answer(prompt: str) -> str:
    """The fake model's answer: each excerpt's number and citation, then the first excerpt's first line."""
    excerpts = re.findall(r"^\[(\d+)\] (.+?)\n(.+)$", prompt, re.MULTILINE)
    if not excerpts:
        return "No excerpts."
    first = excerpts[0]
    return f"[{first[0]}] {first[1]} says: {first[2][:80]} Also see " + ", ".join(f"[{n}]" for n, *_ in excerpts[1:])


@pytest.fixture
def citing_engine(monkeypatch) -> FakeEngine:
    monkeypatch.setattr(fakes, "scripted_answer", citing_answer)
    return FakeEngine(context_length=4096)


@pytest.fixture(scope="module")
def embedder():
    from app.engine.embeddings import load_default_embedder

    return load_default_embedder()


@pytest.fixture
def documents(embedder) -> DocumentSet:
    return DocumentSet(lambda: embedder)


def test_ingest_reports_locations_chunks_and_progress(tmp_path: Path, documents: DocumentSet) -> None:
    files = [write_pdf(tmp_path / "festival.pdf"), write_docx(tmp_path / "travel.docx"),
             write_xlsx(tmp_path / "budget.xlsx")]
    seen: list[tuple[float, str]] = []
    report = documents.ingest(files, progress=lambda done, total, message: seen.append((done / total, message)))
    assert not report.failed
    by_name = {document.name: document for document in report.added}
    assert by_name["festival.pdf"].locations == ("page 1", "page 2", "page 3")
    assert by_name["festival.pdf"].describe() == "3 pages" and by_name["festival.pdf"].chunks == 3
    assert by_name["travel.docx"].locations == ("section Travel", "section Meals")
    assert by_name["budget.xlsx"].describe() == "2 sheets: Budget, Staff"
    assert [d.name for d in documents.documents] == ["festival.pdf", "travel.docx", "budget.xlsx"]
    fractions = [fraction for fraction, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any(message.startswith("Reading festival.pdf") for _, message in seen)
    assert any(message.startswith("Embedding excerpts") for _, message in seen)


def test_retrieval_finds_the_right_page_and_sheet(tmp_path: Path, documents: DocumentSet) -> None:
    documents.ingest([write_pdf(tmp_path / "festival.pdf"), write_xlsx(tmp_path / "budget.xlsx")])
    [best, *_] = documents.retrieve("How much do pears cost?")
    assert best.label == "[1] festival.pdf, page 3" and "four dollars" in best.text
    assert documents.retrieve("Where does the festival take place?")[0].label == "[1] festival.pdf, page 1"
    assert documents.retrieve("Who is the sound engineer?")[0].label == "[1] budget.xlsx, sheet Staff"


def test_bad_files_are_reported_by_name_and_the_good_ones_still_added(tmp_path: Path,
                                                                      documents: DocumentSet) -> None:
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nthis is not really a PDF\n")
    fake_docx = tmp_path / "letter.docx"
    fake_docx.write_text("plain text pretending to be Word")
    report = documents.ingest([broken, write_pdf(tmp_path / "festival.pdf"), fake_docx])
    assert [d.name for d in report.added] == ["festival.pdf"]
    messages = [failure.message for failure in report.failed]
    assert messages[0].startswith("broken.pdf: the PDF is corrupt or unreadable")
    assert messages[1].startswith("letter.docx: not a valid DOCX file")


def test_a_pdf_without_text_is_refused_with_a_reason(tmp_path: Path, documents: DocumentSet) -> None:
    report = documents.ingest([write_pdf(tmp_path / "scan.pdf", pages=[""])])
    assert not report.added and "scan.pdf: no text found" in report.failed[0].message


def test_cancel_leaves_the_set_unchanged(tmp_path: Path, documents: DocumentSet) -> None:
    documents.ingest([write_pdf(tmp_path / "festival.pdf")])
    calls = iter(range(100))
    with pytest.raises(IngestCancelled):
        # the first check (before reading) passes; the second, before embedding, cancels
        documents.ingest([write_docx(tmp_path / "travel.docx")], cancel=lambda: next(calls) >= 1)
    assert [d.name for d in documents.documents] == ["festival.pdf"]
    documents.min_relevance = -1.0  # every excerpt, related or not: the point is which documents are there
    assert [c.hit.chunk.source for c in documents.retrieve("train to Lyon")] == [str(tmp_path / "festival.pdf")] * 3


def test_ingesting_a_file_again_replaces_it_and_remove_forgets_it(tmp_path: Path, documents: DocumentSet) -> None:
    path = write_pdf(tmp_path / "festival.pdf")
    documents.ingest([path])
    write_pdf(path, pages=["Only one page now: plums are cheap."])
    documents.ingest([path])
    assert [d.describe() for d in documents.documents] == ["1 page"]
    assert len(documents.retrieve("plums", k=10)) == 1
    documents.remove(path)
    assert len(documents) == 0
    with pytest.raises(DocQAError, match="Add a document first"):
        documents.retrieve("plums")


def test_ask_streams_an_answer_that_cites_the_right_page(tmp_path: Path, documents: DocumentSet,
                                                         citing_engine: FakeEngine) -> None:
    documents.ingest([write_pdf(tmp_path / "festival.pdf")])
    session = DocQASession(documents, lambda: citing_engine)
    started, deltas = [], []
    answer = asyncio.run(session.ask("How much do pears cost?", on_start=started.append, on_delta=deltas.append))
    assert answer.status == "complete" and "".join(deltas) == answer.text
    assert answer.text.startswith("[1] festival.pdf, page 3 says: Pears cost four dollars")
    assert [c.label for c in started[0]] == [c.label for c in answer.citations]
    assert next(c.label for c in answer.cited) == "[1] festival.pdf, page 3"
    prompt = citing_engine.tokenizer.decode(citing_engine.requests[0].prompt_token_ids)
    assert "<start_of_turn>user\nAnswer the question using only the excerpts below" in prompt  # the chat path
    assert prompt.rstrip().endswith("Question: How much do pears cost?<end_of_turn>\n<start_of_turn>assistant")


def test_a_base_model_gets_a_completion_prompt_and_a_primed_answer(tmp_path: Path, documents: DocumentSet,
                                                                   citing_engine: FakeEngine) -> None:
    citing_engine.chat_template.source = "builtin:gemma"  # no template in the file: the engine lent one
    documents.ingest([write_pdf(tmp_path / "festival.pdf")])
    deltas: list[str] = []
    answer = asyncio.run(DocQASession(documents, lambda: citing_engine).ask("pears?", on_delta=deltas.append))
    prompt = citing_engine.tokenizer.decode(citing_engine.requests[0].prompt_token_ids)
    assert "<start_of_turn>" not in prompt and prompt.endswith(f"Answer, citing the excerpt it comes from: "
                                                               f"{COMPLETION_PRIMER}")
    assert deltas[0] == COMPLETION_PRIMER and answer.text.startswith(COMPLETION_PRIMER)
    assert "\n" in citing_engine.requests[0].sampling_params.stop  # one paragraph: base models ramble on


def test_excerpts_are_dropped_to_fit_the_context_and_a_hopeless_question_says_why(
        tmp_path: Path, documents: DocumentSet, citing_engine: FakeEngine) -> None:
    documents.min_relevance = -1.0  # all three pages go, so that the context has to drop some
    documents.ingest([write_pdf(tmp_path / "festival.pdf")])
    whole = asyncio.run(DocQASession(documents, lambda: citing_engine).ask("How much do pears cost?"))
    assert len(whole.citations) == 3 and whole.prompt_tokens is not None
    citing_engine.context_length = whole.prompt_tokens  # all three excerpts leave no room for an answer
    answer = asyncio.run(DocQASession(documents, lambda: citing_engine).ask("How much do pears cost?"))
    assert len(answer.citations) == 2 and answer.citations[0].label == "[1] festival.pdf, page 3"
    assert answer.status == "complete" and answer.prompt_tokens <= whole.prompt_tokens - 32
    citing_engine.context_length = 200
    with pytest.raises(DocQAError, match="context holds 200"):
        asyncio.run(DocQASession(documents, lambda: citing_engine).ask("How much do pears cost?"))


def test_questions_need_a_model_documents_and_text(tmp_path: Path, documents: DocumentSet,
                                                   citing_engine: FakeEngine) -> None:
    with pytest.raises(DocQAError, match="No model is loaded"):
        asyncio.run(DocQASession(documents, lambda: None).ask("anything"))
    with pytest.raises(DocQAError, match="Add a document first"):
        asyncio.run(DocQASession(documents, lambda: citing_engine).ask("anything"))
    documents.ingest([write_pdf(tmp_path / "festival.pdf")])
    with pytest.raises(DocQAError, match="Type a question"):
        asyncio.run(DocQASession(documents, lambda: citing_engine).ask("   "))


def test_stop_keeps_the_partial_answer(tmp_path: Path, documents: DocumentSet) -> None:
    documents.min_relevance = -1.0  # "tell me forever" (the fake engine's slow stream) matches no page
    documents.ingest([write_pdf(tmp_path / "festival.pdf")])
    engine = FakeEngine(context_length=4096)
    session = DocQASession(documents, lambda: engine, max_tokens=2000)

    async def ask_and_stop() -> object:
        def on_delta(text: str) -> None:
            if "tick tick" in "".join(deltas):
                session.stop()
            deltas.append(text)

        deltas: list[str] = []
        return await session.ask("tell me forever", on_delta=on_delta)

    answer = asyncio.run(ask_and_stop())
    assert answer.status == "stopped" and answer.text.startswith("tick tick") and not session.busy


def test_no_current_model_reads_images() -> None:
    assert not supports_vision(FakeEngine()) and not supports_vision(None)
    assert supports_vision(SimpleNamespace(model=SimpleNamespace(supports_vision=True)))


def test_chat_message_puts_the_question_first_and_numbers_the_excerpts(tmp_path: Path,
                                                                       documents: DocumentSet) -> None:
    documents.ingest([write_pdf(tmp_path / "festival.pdf")])
    text = chat_message("How much do pears cost?", documents.retrieve("How much do pears cost?", k=2))
    assert text.startswith("How much do pears cost?\n\n")
    assert "[1] festival.pdf, page 3\nPears cost four dollars" in text and "[2] festival.pdf" in text
    assert cited_numbers("Pears [1], tickets [2, 3] and [1][4].") == [1, 2, 3, 4]


def test_ingest_on_a_worker_while_questions_are_answered(tmp_path: Path, documents: DocumentSet) -> None:
    documents.ingest([write_pdf(tmp_path / "festival.pdf")])
    files = [write_docx(tmp_path / f"travel{n}.docx") for n in range(4)]
    worker = threading.Thread(target=documents.ingest, args=(files,))
    worker.start()
    while worker.is_alive():  # every answer sees a whole index: never chunks without vectors
        hits = documents.retrieve("pears", k=50)
        assert all(hit.hit.chunk.text for hit in hits)
    worker.join()
    assert len(documents) == 5


def test_excerpts_below_the_relevance_floor_are_not_sent(tmp_path: Path, documents: DocumentSet,
                                                         citing_engine: FakeEngine) -> None:
    documents.ingest([write_pdf(tmp_path / "festival.pdf")])
    everything = DocumentSet(lambda: documents.embedder(), min_relevance=-1.0)
    everything.ingest([tmp_path / "festival.pdf"])
    scores = [c.hit.score for c in everything.retrieve("How much do pears cost?")]
    kept = documents.retrieve("How much do pears cost?")
    assert len(kept) == sum(score >= documents.min_relevance for score in scores) < len(scores)
    answer = asyncio.run(DocQASession(documents, lambda: citing_engine).ask("How much do pears cost?"))
    prompt = citing_engine.tokenizer.decode(citing_engine.requests[-1].prompt_token_ids)
    assert prompt.count("festival.pdf, page") == len(kept) == len(answer.citations)
    with pytest.raises(DocQAError, match="close enough"):
        asyncio.run(DocQASession(documents, lambda: citing_engine).ask("Quantum chromodynamics lattice gauge"))


def test_a_stored_set_comes_back_with_its_embeddings(tmp_path: Path, documents: DocumentSet) -> None:
    store = tmp_path / "store"
    first = DocumentSet(lambda: documents.embedder(), store=store)
    first.ingest([write_pdf(tmp_path / "festival.pdf")])
    expected = [(c.label, round(c.hit.score, 5)) for c in first.retrieve("How much do pears cost?")]
    calls: list[int] = []

    class Counting:  # the same embedder, counting what it is asked to embed
        dimensions = documents.embedder().dimensions

        def count_tokens(self, texts):
            return documents.embedder().count_tokens(texts)

        def embed(self, texts):
            calls.append(len(texts))
            return documents.embedder().embed(texts)

    again = DocumentSet(Counting, store=store)
    assert [d.name for d in again.documents] == ["festival.pdf"]
    assert [(c.label, round(c.hit.score, 5)) for c in again.retrieve("How much do pears cost?")] == expected
    assert calls == [1]  # only the question was embedded: the excerpts' vectors came from the store
    again.remove(tmp_path / "festival.pdf")
    assert DocumentSet(Counting, store=store).documents == []
