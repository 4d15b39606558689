"""The chat's Attach button: documents go with the next message as their extracted text, images as image
inputs when the loaded model has vision (the tiny random-weight Gemma 3 of tests/fixtures/vision) and are
refused, in words, for a text-only one; dropped images join the message too."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from server.fakes import FakeEngine
from studio.doc_files import write_docx, write_pdf
from vision_engines import recording_vision_engine

from app.studio.documents import extract_document

from .drag import drop

WAIT_MS = 15_000


def _png(path: Path, colour: tuple[int, int, int]) -> Path:
    from PIL import Image

    Image.new("RGB", (32, 24), colour).save(path, "PNG")
    return path


def _attach(qtbot, pane, paths: list[Path]):
    pane.dialogs.open_answer = [str(path) for path in paths]
    with qtbot.waitSignal(pane.files_read, timeout=WAIT_MS) as read:
        qtbot.mouseClick(pane.attach_button, Qt.MouseButton.LeftButton)
    return read.args[0]


def _send(qtbot, pane, text: str):
    pane.input.setPlainText(text)
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as outcome:
        qtbot.keyClick(pane.input, Qt.Key.Key_Return)
    return outcome.args[0]


def test_attached_documents_go_whole_with_the_next_message(qtbot, make_window, tmp_path):
    engine = FakeEngine()
    window = make_window(panes=("chat",), engine=engine)
    pane = window.pane("chat")
    pdf, docx = write_pdf(tmp_path / "report.pdf"), write_docx(tmp_path / "notes.docx")
    assert _attach(qtbot, pane, [pdf, docx]).ok
    assert pane.tray.isVisibleTo(pane) and "report.pdf" in pane.tray.label.text()
    assert "notes.docx" in pane.tray.label.text()
    assert _send(qtbot, pane, "Where do we go?").ok
    prompt = engine.tokenizer.decode(engine.requests[-1].prompt_token_ids)
    for path in (pdf, docx):
        assert f"Attached file {path.name}" in prompt and extract_document(path).text.strip() in prompt
    assert not pane.tray.isVisibleTo(pane) and pane.tray.pending == []  # sent: the tray is empty again
    text = pane.transcript.toPlainText()
    assert "File: report.pdf · File: notes.docx" in text and "Where do we go?" in text
    question = text.split("fake-model", 1)[0]  # (the fake's echo of the whole turn follows)
    assert "fourteenth of June" not in question  # the transcript shows the question, not the document's text

    assert _send(qtbot, pane, "And lunch?").ok  # the next question goes alone, the documents stay in the prompt
    follow_up = engine.tokenizer.decode(engine.requests[-1].prompt_token_ids)
    first_turn, last_turn = follow_up.split("<start_of_turn>user")[1], follow_up.split("<start_of_turn>user")[-1]
    assert "Attached file report.pdf" in first_turn and "Attached file" not in last_turn


def test_an_image_for_a_text_only_model_is_refused_in_words(qtbot, make_window, tmp_path):
    engine = FakeEngine()
    window = make_window(panes=("chat",), engine=engine)
    pane = window.pane("chat")
    pane.dialogs.open_answer = [str(_png(tmp_path / "cat.png", (200, 10, 10)))]
    qtbot.mouseClick(pane.attach_button, Qt.MouseButton.LeftButton)
    assert "fake-model reads text only" in pane.error.text() and "cat.png" in pane.error.text()
    assert pane.error.isVisibleTo(pane) and pane.tray.pending == []


def test_a_file_that_cannot_be_read_is_named_and_the_others_still_attach(qtbot, make_window, tmp_path):
    window = make_window(panes=("chat",), engine=FakeEngine())
    pane = window.pane("chat")
    bad = tmp_path / "broken.pdf"
    bad.write_bytes(b"%PDF-1.4 not really")
    good = tmp_path / "notes.txt"
    good.write_text("Lunch is at noon.")
    _attach(qtbot, pane, [bad, good])
    assert "broken.pdf" in pane.error.text() and [a.name for a in pane.tray.pending] == ["notes.txt"]
    qtbot.mouseClick(pane.tray.remove_button, Qt.MouseButton.LeftButton)
    assert pane.tray.pending == [] and not pane.tray.isVisibleTo(pane)


@pytest.fixture
def vision_engine():
    with recording_vision_engine(1024) as engine:
        yield engine


def test_images_reach_a_vision_model_from_the_button_and_from_a_drop(qtbot, make_window, tmp_path, vision_engine):
    window = make_window(panes=("chat",), engine=vision_engine)
    pane = window.pane("chat")
    pane.sampling.boxes["max_tokens"].setValue(3)
    red, green = _png(tmp_path / "red.png", (255, 0, 0)), _png(tmp_path / "green.png", (0, 255, 0))
    assert _attach(qtbot, pane, [red]).ok
    with qtbot.waitSignal(pane.files_read, timeout=WAIT_MS):
        drop(pane.transcript, [green])
    assert [a.name for a in pane.tray.pending] == ["red.png", "green.png"] and pane.error.text() == ""
    assert _send(qtbot, pane, "Which colours?").ok
    request = vision_engine.sent[-1]
    expected = [v.key for path in (red, green) for v in vision_engine.vision.prepare(path.read_bytes()).views]
    assert [v.key for v in request.images] == expected
    image_tokens = request.prompt_token_ids.count(vision_engine.vision.image_token_id)
    assert image_tokens == len(expected) * vision_engine.vision.tokens_per_image
    assert "Image: red.png · Image: green.png" in pane.transcript.toPlainText()



def test_edit_and_resend_keeps_the_questions_files(qtbot, make_window, tmp_path):
    from .test_chat_ux import _click, _links

    engine = FakeEngine()
    window = make_window(panes=("chat",), engine=engine)
    window.show()
    qtbot.waitExposed(window)
    pane = window.pane("chat")
    notes = tmp_path / "notes.txt"
    notes.write_text("Lunch is at noon.")
    _attach(qtbot, pane, [notes])
    assert _send(qtbot, pane, "When is lunch?").ok
    [(_, at)] = _links(pane.transcript, "edit")
    _click(qtbot, pane.transcript, at)
    assert pane.input.toPlainText() == "When is lunch?" and [a.name for a in pane.tray.pending] == ["notes.txt"]
    pane.input.setPlainText("When is lunch, exactly?")
    assert _send(qtbot, pane, "When is lunch, exactly?").ok
    conversation = window.context.history.conversation(pane.conversation_id)
    question = conversation.messages[0]
    assert question.content == "When is lunch, exactly?" and len(conversation.messages) == 2
    assert [a.name for a in conversation.attachments[question.id]] == ["notes.txt"]
    assert "Lunch is at noon." in engine.tokenizer.decode(engine.requests[-1].prompt_token_ids)
