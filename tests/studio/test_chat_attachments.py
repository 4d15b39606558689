"""Files attached to a chat question (app/studio/attachments.py, ChatService.send): documents reach the model
as their extracted text, images as image inputs of a vision model (the tiny random-weight Gemma 3 of
tests/fixtures/vision), both kept in History with the question for the turns that follow."""

from __future__ import annotations

import asyncio
import importlib
import io
import sys
from pathlib import Path

import pytest
from studio.doc_files import write_docx, write_pdf, write_scanned_pdf
from vision_engines import recording_vision_engine

from app.studio.attachments import AttachmentError, ScannedPDF, read_attachment, read_files, read_pages
from app.studio.chat import ChatError, ChatService
from app.studio.documents import PageScale, extract_document, render_pages
from app.studio.history import Attachment, History

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
FakeEngine = importlib.import_module("server.fakes").FakeEngine


@pytest.fixture
def history(tmp_path):
    with History(tmp_path / "history.sqlite3") as opened:
        yield opened


def _png(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return buffer.getvalue()


def test_documents_are_read_by_the_extraction_service(tmp_path):
    pdf, docx = write_pdf(tmp_path / "report.pdf"), write_docx(tmp_path / "notes.docx")
    for path in (pdf, docx):
        attachment = read_attachment(path)
        assert attachment.kind == "document" and attachment.name == path.name
        assert attachment.text == extract_document(path).text.strip()
    assert "fourteenth of June" in read_attachment(pdf).text and "by train" in read_attachment(docx).text


def test_a_scanned_pdf_is_read_as_page_images_for_a_vision_model_and_refused_in_words_without(tmp_path):
    from PIL import Image

    scan = write_scanned_pdf(tmp_path / "scan.pdf", [f"Page {n}." for n in range(1, 5)])
    with pytest.raises(ScannedPDF) as raised:
        read_attachment(scan)
    assert raised.value.page_count == 4
    text_only = read_files([scan], lambda: False)
    assert text_only.attachments == [] and text_only.problems == [str(raised.value)]
    assert str(raised.value).startswith("scan.pdf has no text layer (scanned pages): a vision model is needed")

    scale = PageScale(64, "long")
    read = read_files([scan, write_docx(tmp_path / "notes.docx")], lambda: False, scale)
    assert [a.name for a in read.attachments] == [f"scan.pdf, page {n}" for n in range(1, 5)] + ["notes.docx"]
    assert read.problems == []
    rendered = render_pages(scan, dpi=scale)  # each page as render_pages draws it at that scale
    for attachment, expected in zip(read.attachments[:4], rendered, strict=True):
        got = Image.open(io.BytesIO(attachment.data))
        assert attachment.kind == "image" and got.size == expected.size
        assert got.tobytes() == expected.convert(got.mode).tobytes()

    capped, note = read_pages(scan, 4, scale, limit=3)
    assert [a.data for a in capped] == [a.data for a in read.attachments[:3]]
    assert note == ("scan.pdf has 4 pages: only pages 1-3 go with your message as images (at most 3 pages per "
                    "message). Ask about the rest in the Documents pane.")


def test_images_are_kept_as_bytes_and_bad_files_are_refused_by_name(tmp_path):
    image = tmp_path / "red.png"
    image.write_bytes(_png((255, 0, 0)))
    assert read_attachment(image) == Attachment("image", "red.png", image.read_bytes())
    (tmp_path / "song.mp3").write_bytes(b"ID3")
    with pytest.raises(AttachmentError, match=r"song\.mp3: only images"):
        read_attachment(tmp_path / "song.mp3")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(AttachmentError, match=r"empty\.txt"):
        read_attachment(tmp_path / "empty.txt")
    with pytest.raises(AttachmentError, match=r"gone\.png"):
        read_attachment(tmp_path / "gone.png")


def test_a_document_goes_whole_with_its_question_and_stays_for_later_turns(tmp_path, history):
    engine = FakeEngine()
    service = ChatService(history, lambda: engine)
    conversation = service.new_conversation()
    document = read_attachment(write_pdf(tmp_path / "report.pdf"))
    assert all(fact in document.text for fact in ("Lyon", "twelve euros", "orchard market"))  # all three pages
    asyncio.run(service.send(conversation.id, "Where is the festival?", attachments=[document]))
    asyncio.run(service.send(conversation.id, "And the price?"))
    first, second = (engine.tokenizer.decode(r.prompt_token_ids) for r in engine.requests)
    for prompt in (first, second):
        assert "Attached file report.pdf" in prompt and document.text in prompt
        assert prompt.index("Lyon") < prompt.index("Where is the festival?")
    stored = history.conversation(conversation.id)
    question = stored.messages[0]
    assert question.content == "Where is the festival?"  # the transcript shows what was typed
    assert stored.attachments == {question.id: (document,)}
    assert not engine.requests[0].images


def test_an_image_for_a_text_only_model_is_refused_before_anything_is_saved(history):
    service = ChatService(history, lambda: FakeEngine())
    conversation = service.new_conversation()
    image = Attachment("image", "cat.png", _png((0, 0, 255)))
    with pytest.raises(ChatError, match=r"fake-model reads text only.*cat\.png"):
        asyncio.run(service.send(conversation.id, "What is this?", attachments=[image]))
    assert history.conversation(conversation.id).messages == ()


def test_attachments_survive_a_reopen_and_go_with_their_question(tmp_path):
    path = tmp_path / "history.sqlite3"
    with History(path) as first:
        conversation = first.create_conversation()
        question = first.add_message(conversation.id, "user", "look")
        files = (Attachment("image", "a.png", _png((1, 2, 3))), Attachment("document", "b.txt", b"bee"))
        first.add_attachments(question.id, files)
    with History(path) as again:
        assert again.conversation(conversation.id).attachments == {question.id: files}
        again.delete_message(question.id)
        assert again.conversation(conversation.id).attachments == {}


@pytest.fixture(scope="module")
def vision_client():
    with recording_vision_engine(1024) as engine:
        yield engine


def test_images_reach_a_vision_model_as_its_image_inputs_in_every_later_turn(history, vision_client):
    assert vision_client.model.supports_vision
    vision_client.sent.clear()
    service = ChatService(history, lambda: vision_client)
    conversation = service.new_conversation()
    red, green = _png((255, 0, 0)), _png((0, 255, 0), (30, 40))
    service.configure(conversation.id, "", service.settings_of(conversation).__class__(max_tokens=4))
    asyncio.run(service.send(conversation.id, "What colour?",
                             attachments=[Attachment("image", "red.png", red), Attachment("image", "g.png", green)]))
    asyncio.run(service.send(conversation.id, "And now?"))
    expected = [view.key for data in (red, green) for view in vision_client.vision.prepare(data).views]
    for request in vision_client.sent:
        assert [view.key for view in request.images] == expected
        image_tokens = request.prompt_token_ids.count(vision_client.vision.image_token_id)
        assert image_tokens == len(request.images) * vision_client.vision.tokens_per_image


def test_a_document_too_long_for_the_context_is_refused_and_not_kept(tmp_path, history):
    service = ChatService(history, lambda: FakeEngine(context_length=120))
    conversation = service.new_conversation()
    document = read_attachment(write_pdf(tmp_path / "report.pdf"))
    with pytest.raises(ChatError, match=r"context holds 120\. .*attached documents are sent whole"):
        asyncio.run(service.send(conversation.id, "Where?", attachments=[document]))
    assert history.conversation(conversation.id).messages == ()  # the next question is not burdened with it
    answer = asyncio.run(service.send(conversation.id, "Where?"))
    assert answer.status == "complete"
