"""The small widgets every pane uses to report on work: an error line and a progress row."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton

from app.studio.tasks import Progress


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


def show_error(label: QLabel, text: str | None) -> None:
    """Show `text` in an error label, or hide the label when there is none."""
    label.setText(text or "")
    label.setVisible(bool(text))


def show_progress(bar: QProgressBar, caption: QLabel, cancel: QPushButton, progress: Progress | None) -> None:
    """A progress row (see progress_row) showing `progress`; None hides it. A fraction not yet
    known shows a busy bar."""
    for widget in (bar, cancel):
        widget.setVisible(progress is not None)
    if progress is None:
        caption.hide()
        return
    fraction = progress.fraction
    bar.setRange(0, 0 if fraction is None else 1000)  # (0, 0): busy, size unknown yet
    if fraction is not None:
        bar.setValue(round(fraction * 1000))
    caption.setText(progress.message)
    caption.show()
