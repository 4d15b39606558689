"""The small widgets every pane uses to report on work: an error line and a progress row."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton


def error_label(*, selectable: bool = False, hidden: bool = False) -> QLabel:
    """A wrapped label styled as an error (theme.py's `errorText`)."""
    label = QLabel()
    label.setObjectName("errorText")
    label.setWordWrap(True)
    if selectable:  # so the user can copy the message into a report
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    if hidden:
        label.hide()
    return label


def progress_row() -> tuple[QHBoxLayout, QProgressBar, QLabel, QPushButton]:
    """A progress bar, its caption and a Cancel button, laid out in one row."""
    bar, caption, cancel = QProgressBar(), QLabel(), QPushButton("Cancel")
    row = QHBoxLayout()
    row.addWidget(bar, 1)
    row.addWidget(caption)
    row.addWidget(cancel)
    return row, bar, caption, cancel
