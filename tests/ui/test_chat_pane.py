"""The Chat pane over the fake engine: streaming into the view, stop, regenerate, settings, persistence, errors."""

from __future__ import annotations

from PySide6.QtCore import Qt
from server.fakes import FakeEngine

from app.studio.chat import ChatSettings

from .held_engine import HeldEngine

WAIT_MS = 10_000


def _chat(window):
    return window.pane("chat")


def _ask(qtbot, pane, text: str):
    pane.input.setPlainText(text)
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as outcome:
        qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
    return outcome.args[0]


def test_answer_streams_into_the_transcript_and_is_saved(qtbot, make_window):
    engine = HeldEngine(parts=["Echo: ", "hello ", "there"])
    window = make_window(panes=("chat",), engine=engine)
    pane = _chat(window)
    pane.input.setPlainText("hello there")
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as outcome:
        qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
        for shown in ("Echo:", "Echo: hello", "Echo: hello there"):  # each part is on screen before the next
            qtbot.waitUntil(lambda: engine.waiting, timeout=WAIT_MS)
            engine.release()
            qtbot.waitUntil(lambda shown=shown: shown in pane.transcript.toPlainText(), timeout=WAIT_MS)
            assert shown == "Echo: hello there" or "Echo: hello there" not in pane.transcript.toPlainText()
    result = outcome.args[0]
    assert result.ok and result.value.status == "complete"
    text = pane.transcript.toPlainText()
    assert "You  Copy · Edit · Delete\nhello there" in text and "Echo: hello there" in text
    assert "tok/s" in text and "prompt" in text  # the answer's statistics line
    [conversation] = window.context.history.conversations()
    assert conversation.title == "hello there"
    assert [m.content for m in window.context.history.conversation(conversation.id).messages] == [
        "hello there", "Echo: hello there"]
    assert pane.conversations.rowCount() == 1 and pane.input.toPlainText() == ""


def test_stop_ends_the_answer_and_keeps_what_was_shown(qtbot, make_window):
    engine = FakeEngine()
    window = make_window(panes=("chat",), engine=engine)
    pane = _chat(window)
    pane.sampling.boxes["max_tokens"].setValue(5000)
    pane.input.setPlainText("tell me forever")
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as outcome:
        qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: pane.transcript.toPlainText().count("tick") >= 3, timeout=WAIT_MS)
        assert pane.stop_button.isEnabled() and not pane.send_button.isEnabled()
        qtbot.mouseClick(pane.stop_button, Qt.MouseButton.LeftButton)
    answer = outcome.args[0].value
    assert answer.status == "stopped" and answer.text.startswith("tick tick tick")
    assert engine.closed_early == {engine.requests[-1].request_id}
    stored = window.context.history.conversation(pane.conversation_id).messages[-1]
    assert stored.status == "stopped" and stored.content == answer.text
    assert "(stopped)" in pane.transcript.toPlainText()
    assert pane.send_button.isEnabled() and not pane.stop_button.isEnabled()


def test_regenerate_answers_the_last_question_again(qtbot, make_window):
    engine = FakeEngine()
    window = make_window(panes=("chat",), engine=engine)
    pane = _chat(window)
    _ask(qtbot, pane, "once")
    assert pane.regenerate_button.isEnabled()
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS):
        qtbot.mouseClick(pane.regenerate_button, Qt.MouseButton.LeftButton)
    messages = window.context.history.conversation(pane.conversation_id).messages
    assert [m.role for m in messages] == ["user", "assistant"] and len(engine.requests) == 2
    assert pane.transcript.toPlainText().count("Echo: once") == 1


def test_system_prompt_and_sampling_settings_go_with_the_conversation(qtbot, make_window):
    engine = FakeEngine()
    window = make_window(panes=("chat",), engine=engine)
    pane = _chat(window)
    pane.system_prompt.setPlainText("Answer in French.")
    pane.sampling.boxes["temperature"].setValue(0.25)
    pane.sampling.boxes["seed"].setValue(42)
    _ask(qtbot, pane, "bonjour")
    request = engine.requests[-1]
    assert "system\nAnswer in French." in engine.tokenizer.decode(request.prompt_token_ids)
    assert request.sampling_params.temperature == 0.25 and request.sampling_params.seed == 42
    conversation = window.context.history.conversation(pane.conversation_id)
    assert conversation.system_prompt == "Answer in French."
    assert ChatSettings.from_dict(conversation.settings).seed == 42

    pane.new_chat()  # a new conversation starts from the defaults, the old one keeps its own
    assert pane.system_prompt.toPlainText() == "" and pane.sampling.settings().seed is None
    pane.open_conversation(conversation.id)
    assert pane.system_prompt.toPlainText() == "Answer in French." and pane.sampling.settings().seed == 42


def test_conversation_is_there_after_a_restart(qtbot, make_window, make_context):
    first = make_window(panes=("chat",))
    _ask(qtbot, _chat(first), "remember this")
    first.close()

    again = make_window(make_context(FakeEngine()), panes=("chat",))  # same data folder, new window
    pane = _chat(again)
    assert pane.conversations.rowCount() == 1
    assert pane.conversations.conversation_at(0).title == "remember this"
    assert "Echo: remember this" in pane.transcript.toPlainText()
    assert pane.conversation_list.currentIndex().row() == 0


def test_without_a_model_sending_is_off_and_the_pane_says_why(qtbot, make_window, make_context):
    window = make_window(make_context(), panes=("chat",))
    pane = _chat(window)
    assert not pane.send_button.isEnabled()
    assert "No model is loaded" in pane.model_hint.text() and pane.model_hint.isVisibleTo(pane)


def test_a_refused_question_is_explained_and_given_back(qtbot, make_window):
    window = make_window(panes=("chat",), engine=FakeEngine(context_length=64))
    pane = _chat(window)
    result = _ask(qtbot, pane, "x" * 200)
    assert not result.ok
    assert "context holds 64" in pane.error.text() and pane.error.isVisibleTo(pane)
    assert "Traceback" not in pane.error.text()


def test_delete_asks_first(qtbot, make_window):
    window = make_window(panes=("chat",))
    pane = _chat(window)
    _ask(qtbot, pane, "to be deleted")
    window.context.dialogs.confirm_answer = False
    pane.delete_conversation()
    assert pane.conversations.rowCount() == 1
    window.context.dialogs.confirm_answer = True
    pane.delete_conversation()
    assert pane.conversations.rowCount() == 0 and window.context.history.conversations() == []
    assert "to be deleted" in window.context.dialogs.asked[0]


def test_a_long_conversation_title_ends_in_an_ellipsis_not_a_clipped_row(qtbot, make_window):
    window = make_window(panes=("chat",))
    window.show()
    qtbot.waitExposed(window)
    pane = _chat(window)
    title = "How do I read this CSV file in Python? Show a table of the example data, please"
    _ask(qtbot, pane, title)
    listing = pane.conversation_list
    assert listing.model().index(0, 0).data(Qt.ItemDataRole.ToolTipRole).startswith(title[:40])
    assert listing.horizontalScrollBar().maximum() == 0 or not listing.horizontalScrollBar().isVisible()
    assert listing.textElideMode() == Qt.TextElideMode.ElideRight
    assert listing.visualRect(listing.model().index(0, 0)).width() > listing.viewport().width()  # the premise
