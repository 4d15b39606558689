"""The Chat pane as LM Studio and Jan users expect it: rendered Markdown with code Copy and a raw view,
answer versions, per-message actions, the keys, live speed, and the history usable while an answer streams."""

from __future__ import annotations

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QTextCursor
from server.fakes import FakeEngine

WAIT_MS = 10_000
MARKDOWN = "x\n# Title\n\n- apples\n- pears\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\nprint('hi')\n```\n"


def _pane(make_window, engine=None):
    window = make_window(panes=("chat", "models", "server"), engine=engine or FakeEngine())
    return window, window.pane("chat")


def _ask(qtbot, pane, text: str):
    pane.input.setPlainText(text)
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as outcome:
        qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
    return outcome.args[0]


def _links(transcript, what: str) -> list[tuple[str, int]]:
    """(href, position) of every link in the transcript whose action is `what`."""
    found, block = [], transcript.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            href = fragment.charFormat().anchorHref()
            if href and f":{what}/" in href:
                found.append((href, fragment.position()))
            it += 1
        block = block.next()
    return found


def _click(qtbot, transcript, position: int) -> None:
    """A real click on the text at `position` (a link)."""
    cursor = QTextCursor(transcript.document())
    cursor.setPosition(position + 1)
    transcript.ensureCursorVisible()
    transcript.setTextCursor(cursor)
    transcript.ensureCursorVisible()
    point = transcript.cursorRect(cursor).center()
    point.setX(point.x() - 2)
    qtbot.mouseClick(transcript.viewport(), Qt.MouseButton.LeftButton, pos=point)


def test_answers_render_markdown_with_a_working_code_copy_and_a_raw_view(qtbot, make_window, copied):
    window, pane = _pane(make_window)
    window.show()
    qtbot.waitExposed(window)
    _ask(qtbot, pane, MARKDOWN)
    document = pane.transcript.document()
    headings = []
    block, tables, lists, code = document.begin(), 0, set(), []
    while block.isValid():
        if block.blockFormat().headingLevel():
            headings.append(block.text())
        if block.textList() is not None:
            lists.add(block.text())
        first = block.begin().fragment() if not block.begin().atEnd() else None
        if first is not None and "monospace" in (first.charFormat().fontFamilies() or []):
            code.append((block.text(), first.charFormat().foreground().color().name()))
        block = block.next()
    cursor = QTextCursor(document)
    while not cursor.atEnd():
        if cursor.currentTable() is not None:
            tables += 1
            break
        cursor.movePosition(QTextCursor.MoveOperation.NextBlock)
    assert headings == ["Title"] and lists == {"apples", "pears"} and tables == 1
    [(line, colour)] = code
    assert line.strip() == "print('hi')" and colour != "#000000"  # monospace, highlighted by pygments
    answer = pane.transcript.toPlainText().split("fake-model", 1)[1]  # the question above is shown as typed
    assert "```" not in answer and "# Title" not in answer and "Title" in answer

    [(_, position)] = _links(pane.transcript, "code")
    _click(qtbot, pane.transcript, position)
    assert copied == ["print('hi')"]

    pane.raw_view.setChecked(True)
    raw = pane.transcript.toPlainText().split("fake-model", 1)[1]
    assert "# Title" in raw and "```python" in raw and "| a | b |" in raw


def test_regenerate_keeps_the_earlier_answer_as_a_version(qtbot, make_window):
    window, pane = _pane(make_window)
    _ask(qtbot, pane, "once")
    history = window.context.history
    first = history.conversation(pane.conversation_id).messages[-1]
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS):
        qtbot.mouseClick(pane.regenerate_button, Qt.MouseButton.LeftButton)
    second = history.conversation(pane.conversation_id).messages[-1]
    assert second.id != first.id and [v.id for v in history.versions(second.id)] == [first.id, second.id]
    assert "2/2" in pane.transcript.toPlainText() and pane.transcript.toPlainText().count("Echo: once") == 1
    [(href, _)] = _links(pane.transcript, "version")
    pane.transcript.anchorClicked.emit(QUrl(href))  # ‹ : back to the first version
    assert history.conversation(pane.conversation_id).messages[-1].id == first.id
    assert "1/2" in pane.transcript.toPlainText()
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS):
        qtbot.mouseClick(pane.regenerate_button, Qt.MouseButton.LeftButton)
    assert "3/3" in pane.transcript.toPlainText()
    assert [m.role for m in history.conversation(pane.conversation_id).messages] == ["user", "assistant"]


def test_copy_edit_and_resend_and_delete_one_message(qtbot, make_window, copied):
    window, pane = _pane(make_window)
    _ask(qtbot, pane, "first question")
    _ask(qtbot, pane, "second question")
    history = window.context.history
    copies = _links(pane.transcript, "copy")
    pane.transcript.anchorClicked.emit(QUrl(copies[1][0]))
    assert copied == ["Echo: first question"]

    edits = _links(pane.transcript, "edit")
    pane.transcript.anchorClicked.emit(QUrl(edits[0][0]))  # edit the first question
    assert pane.input.toPlainText() == "first question" and pane.edit_note.isVisibleTo(pane)
    pane.input.setPlainText("first question, reworded")
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS):
        qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
    assert [m.content for m in history.conversation(pane.conversation_id).messages] == [
        "first question, reworded", "Echo: first question, reworded"]

    deletes = _links(pane.transcript, "delete")
    pane.transcript.anchorClicked.emit(QUrl(deletes[1][0]))  # the answer
    assert [m.role for m in history.conversation(pane.conversation_id).messages] == ["user"]
    assert "Echo:" not in pane.transcript.toPlainText()


def test_a_link_in_an_answer_cannot_act_on_messages(qtbot, make_window, copied):
    window, pane = _pane(make_window)
    _ask(qtbot, pane, "[x](paddock:delete/1/0)")
    count = len(window.context.history.conversation(pane.conversation_id).messages)
    for href in ("paddock:delete/1/0", "paddock:copy/1/0"):
        pane.transcript.anchorClicked.emit(QUrl(href))
    assert len(window.context.history.conversation(pane.conversation_id).messages) == count and copied == []


def test_enter_sends_shift_enter_breaks_the_line_tab_moves_on(qtbot, make_window):
    window, pane = _pane(make_window)
    window.show()
    qtbot.waitExposed(window)
    pane.input.setFocus()
    qtbot.keyClicks(pane.input, "two")
    qtbot.keyClick(pane.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(pane.input, "lines")
    assert pane.input.toPlainText() == "two\nlines"
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS):
        qtbot.keyClick(pane.input, Qt.Key.Key_Return)
    assert window.context.history.conversation(pane.conversation_id).messages[0].content == "two\nlines"
    assert pane.input.toPlainText() == ""

    window.context.settings.set("chat.enter_sends", False)  # configured: Enter is a new line, Ctrl+Enter sends
    qtbot.keyClicks(pane.input, "a")
    qtbot.keyClick(pane.input, Qt.Key.Key_Return)
    assert pane.input.toPlainText() == "a\n"
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS):
        qtbot.keyClick(pane.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)

    window.activateWindow()
    pane.input.setFocus()
    qtbot.waitUntil(pane.input.hasFocus)
    qtbot.keyClick(pane.input, Qt.Key.Key_Tab)
    assert not pane.input.hasFocus() and "\t" not in pane.input.toPlainText()


def test_esc_stops_ctrl_n_starts_a_chat_ctrl_digits_switch_panes(qtbot, make_window):
    window, pane = _pane(make_window)
    window.show()
    qtbot.waitExposed(window)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    pane.sampling.boxes["max_tokens"].setValue(5000)
    pane.input.setPlainText("tell me forever")
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as outcome:
        qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: "tok/s" in pane.live.text(), timeout=WAIT_MS)  # live speed while streaming
        assert pane.live.text().endswith(" s")
        pane.input.setFocus()
        qtbot.keyClick(pane.input, Qt.Key.Key_Escape)
    assert outcome.args[0].value.status == "stopped" and pane.live.text() == ""

    asked = pane.conversation_id
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert pane.conversation_id is None and asked is not None and pane.transcript.toPlainText() == ""
    qtbot.keyClick(window, Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
    assert window.stack.currentWidget() is window.pane("server")
    qtbot.keyClick(window, Qt.Key.Key_1, Qt.KeyboardModifier.ControlModifier)
    assert window.stack.currentWidget() is pane


def test_the_history_is_usable_while_an_answer_streams_with_rename_and_search(qtbot, make_window):
    window, pane = _pane(make_window)
    _ask(qtbot, pane, "about cats")
    cats = pane.conversation_id
    pane.new_chat()
    pane.sampling.boxes["max_tokens"].setValue(5000)
    pane.input.setPlainText("tell me forever")
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS):
        qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: pane.transcript.toPlainText().count("tick") >= 2, timeout=WAIT_MS)
        streaming = pane.conversation_id
        assert pane.conversation_list.isEnabled()
        pane.conversation_list.setCurrentIndex(pane.conversations.index(pane.conversations.row_of(cats)))
        assert pane.conversation_id == cats and "Echo: about cats" in pane.transcript.toPlainText()
        qtbot.wait(100)  # deltas keep arriving for the other conversation
        assert "tick" not in pane.transcript.toPlainText()
        window.context.dialogs.text_answer = "Cats, renamed"
        qtbot.mouseClick(pane.rename_button, Qt.MouseButton.LeftButton)
        pane.stop()
    assert window.context.history.conversation(cats, with_messages=False).title == "Cats, renamed"
    stored = window.context.history.conversation(streaming).messages[-1]
    assert stored.status == "stopped" and stored.content.startswith("tick tick")  # it streamed on, saved
    pane.search.setText("renamed")
    assert pane.conversations.rowCount() == 1 and pane.conversations.conversation_at(0).id == cats
    pane.search.setText("")
    assert pane.conversations.rowCount() == 2
