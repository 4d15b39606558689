"""Answers rendered as Markdown while they stream (not only at the end): headings, lists and code
blocks, an unclosed code fence included, with the view following the end unless the user scrolled up.
The answer arrives in parts the test lets through (held_engine.py), so nothing here is timed."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractSlider

from .held_engine import HeldEngine

WAIT_MS = 10_000


def _blocks(transcript) -> list[tuple[str, int, bool, bool]]:
    """(text, heading level, in a list, monospace) of every block in the transcript."""
    out, block = [], transcript.document().begin()
    while block.isValid():
        first = block.begin().fragment() if not block.begin().atEnd() else None
        mono = first is not None and "monospace" in (first.charFormat().fontFamilies() or [])
        out.append((block.text(), block.blockFormat().headingLevel(), block.textList() is not None, mono))
        block = block.next()
    return out


def _start(qtbot, make_window, parts: list[str]):
    engine = HeldEngine(parts=parts)
    window = make_window(panes=("chat",), engine=engine)
    window.resize(900, 500)
    window.show()
    qtbot.waitExposed(window)
    pane = window.pane("chat")
    pane.input.setPlainText("Plan it")
    qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
    return engine, pane


def _let_through(qtbot, engine: HeldEngine, shown) -> None:
    qtbot.waitUntil(lambda: engine.waiting, timeout=WAIT_MS)
    engine.release()
    qtbot.waitUntil(shown, timeout=WAIT_MS)


def test_markdown_is_rendered_while_the_answer_streams(qtbot, make_window):
    engine, pane = _start(qtbot, make_window, ["# Plan\n\n- one\n", "- two\n\n```python\nprint(1)\n",
                                               "print(2)\n```\n\nDone **now**."])
    transcript = pane.transcript
    _let_through(qtbot, engine, lambda: ("Plan", 1, False, False) in _blocks(transcript))
    assert pane.chat.busy and engine.sent == 1  # rendered mid-answer, before the rest was sent
    assert ("one", 0, True, False) in _blocks(transcript) and "# Plan" not in transcript.toPlainText()

    # the fence is still open: what came so far is a code block already, with its Copy
    _let_through(qtbot, engine, lambda: ("print(1)", 0, False, True) in _blocks(transcript))
    assert pane.chat.busy and "```" not in transcript.toPlainText()
    assert {("one", 0, True, False), ("two", 0, True, False)} <= set(_blocks(transcript))
    assert transcript.code_blocks == ["print(1)"]

    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS):
        _let_through(qtbot, engine, lambda: not pane.chat.busy)
    blocks = _blocks(transcript)
    assert ("print(2)", 0, False, True) in blocks and transcript.code_blocks == ["print(1)\nprint(2)"]
    assert ("Done now.", 0, False, False) in blocks


def test_deltas_are_gathered_and_rendered_together_not_one_by_one(qtbot, make_window):
    engine, pane = _start(qtbot, make_window, ["Hello", " there"])
    transcript = pane.transcript
    _let_through(qtbot, engine, lambda: "Hello" in transcript.toPlainText())
    rendered = transcript.toPlainText()
    transcript.append_delta(" *and*")
    transcript.append_delta(" more")
    assert transcript.toPlainText() == rendered  # not yet: the render timer gathers them
    qtbot.waitUntil(lambda: "Hello and more" in transcript.toPlainText(), timeout=WAIT_MS)
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS):
        engine.release()


def test_the_view_follows_the_answer_unless_the_user_scrolled_up(qtbot, make_window):
    lines = [f"Line {n} of the answer." for n in range(120)]
    parts = ["\n\n".join(lines[:60]), "\n\n" + "\n\n".join(lines[60:90]), "\n\n" + "\n\n".join(lines[90:])]
    engine, pane = _start(qtbot, make_window, parts)
    bar = pane.transcript.verticalScrollBar()
    _let_through(qtbot, engine, lambda: "Line 59 of" in pane.transcript.toPlainText())
    assert bar.maximum() > 0 and bar.value() == bar.maximum()  # following the end

    bar.triggerAction(QAbstractSlider.SliderAction.SliderToMinimum)  # the user scrolls up to read
    _let_through(qtbot, engine, lambda: "Line 89 of" in pane.transcript.toPlainText())
    assert bar.value() == 0

    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS):  # the answer ends: rendered again whole
        _let_through(qtbot, engine, lambda: not pane.chat.busy)
    assert "Line 119 of" in pane.transcript.toPlainText() and bar.value() == 0  # and still where the user was


def test_streamed_lines_stay_lines_when_the_answer_ends_and_images_are_links(qtbot, make_window):
    engine, pane = _start(qtbot, make_window, ["Step one\nStep two\n", "Step three\n\n![a cat](https://x.org/c.png)"])
    transcript = pane.transcript
    _let_through(qtbot, engine, lambda: "Step two" in transcript.toPlainText())
    streamed = transcript.toPlainText()
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS):
        _let_through(qtbot, engine, lambda: not pane.chat.busy)
    text = transcript.toPlainText().replace("\u2028", "\n")  # a <br> is a line separator in Qt's text
    assert "Step one\nStep two\nStep three" in text  # not "Step one Step two Step three"
    assert "Step one\u2028Step two" in streamed or "Step one\nStep two" in streamed  # the same while streaming
    assert "[image: a cat]" in text and "<img" not in transcript.toHtml()  # a link, not a broken-image icon
