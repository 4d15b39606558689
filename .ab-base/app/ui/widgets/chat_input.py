"""The message box: Enter sends and Shift+Enter starts a new line (or, configured, Ctrl+Enter sends),
Tab moves the focus on instead of typing a tab, as in LM Studio, Jan and chat web apps."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget

RETURN_KEYS = (Qt.Key.Key_Return, Qt.Key.Key_Enter)


class ChatInput(QPlainTextEdit):
    submitted = Signal()

    def __init__(self, enter_sends: Callable[[], bool] = lambda: True, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._enter_sends = enter_sends  # read at each key press: the setting may change while running
        self.setTabChangesFocus(True)
        self.update_placeholder()

    def update_placeholder(self) -> None:
        keys = "Enter sends · Shift+Enter new line" if self._enter_sends() else "Ctrl+Enter sends"
        self.setPlaceholderText(f"Message the model… ({keys})")

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in RETURN_KEYS:
            modifiers = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
            ctrl = modifiers == Qt.KeyboardModifier.ControlModifier
            plain = modifiers == Qt.KeyboardModifier.NoModifier
            if ctrl or (plain and self._enter_sends()):
                self.submitted.emit()
                return
            if modifiers & Qt.KeyboardModifier.ShiftModifier or plain:
                self.insertPlainText("\n")  # Shift+Enter (or Enter when it does not send): a new line
                return
        super().keyPressEvent(event)
