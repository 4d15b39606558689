"""The chat transcript: each turn as a header and its text, the answer being generated growing at the end.

Text is shown as typed or generated (plain text: what was saved is what is shown).
While an answer streams, `append_delta` adds each delta at the end of the document without
re-laying out the rest; the pane re-renders the whole conversation when the answer ends,
which adds that answer's statistics line.
"""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QTextBlockFormat, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextBrowser, QWidget

from app.studio.chat import AnswerStats
from app.studio.history import Conversation, Message

STATUS_NOTES = {
    "stopped": "stopped",
    "interrupted": "interrupted: the Studio closed while this answer was streaming",
    "error": "failed",
}


class TranscriptView(QTextBrowser):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self.setPlaceholderText("Ask something below. Answers stream in here and are saved as they arrive.")
        self._header = QTextCharFormat()
        self._header.setFontWeight(QFont.Weight.Bold)
        self._body = QTextCharFormat()
        self._note = QTextCharFormat()
        self._note.setForeground(QColor("#808080"))
        self._note.setFontItalic(True)

    def show_conversation(self, conversation: Conversation | None, model_label: str = "") -> None:
        """Render every turn; a message still streaming ends the document, ready for `append_delta`."""
        self.clear()
        if conversation is None:
            return
        cursor = QTextCursor(self.document())
        first = True
        for message in conversation.messages:
            if message.role not in ("user", "assistant"):
                continue
            self._turn(cursor, message, model_label, first)
            first = False
        self._scroll_to_end()

    def append_delta(self, text: str) -> None:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text, self._body)
        self._scroll_to_end()

    def _turn(self, cursor: QTextCursor, message: Message, model_label: str, first: bool) -> None:
        spacing = QTextBlockFormat()
        spacing.setTopMargin(0 if first else 14)
        if not first:
            cursor.insertBlock(spacing, self._header)
        else:
            cursor.setBlockFormat(spacing)
            cursor.setCharFormat(self._header)
        who = "You" if message.role == "user" else (message.model or model_label or "Assistant")
        cursor.insertText(who, self._header)
        cursor.insertBlock(QTextBlockFormat(), self._body)
        cursor.insertText(message.content, self._body)
        if message.role == "assistant" and message.status != "streaming":
            note = AnswerStats.from_message(message).describe()
            if message.status in STATUS_NOTES:
                note = f"({STATUS_NOTES[message.status]}) {note}".strip()
            if note:
                cursor.insertBlock(QTextBlockFormat(), self._note)
                cursor.insertText(note, self._note)

    def _scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
