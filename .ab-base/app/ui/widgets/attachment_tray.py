"""Files waiting to go with the next question, shown above the message box (as LM Studio and Jan show them).

The tray only holds and shows them; the pane reads the files (on a worker) and takes them
when it sends. "Remove" drops them all. Each file is a tile: an image's thumbnail (an image
that cannot be decoded shows a warning icon and says so), a document's file icon.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QIcon, QPixmap
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListView,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app.studio.history import Attachment
from app.ui.widgets.thumbnails import BROKEN_NOTE, THUMB_PX, thumbnail

TILE_HEIGHT = THUMB_PX + 44  # a thumbnail, its name under it and a horizontal scroll bar


def describe(attachment: Attachment) -> str:
    """'report.pdf (2,345 characters)' or 'photo.png (image, 310 KB)'."""
    if attachment.kind == "image":
        return f"{attachment.name} (image, {max(1, len(attachment.data) // 1000):,} KB)"
    return f"{attachment.name} ({len(attachment.text):,} characters)"


class AttachmentTray(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.pending: list[Attachment] = []
        self.label = QLabel()
        self.label.setObjectName("mutedText")
        self.label.setWordWrap(True)  # many names wrap, never widen the window
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Send the next question without these files")
        self.remove_button.clicked.connect(self.clear)
        self.tiles = QListWidget()  # one row that scrolls sideways: many files never widen the window
        self.tiles.setViewMode(QListView.ViewMode.IconMode)
        self.tiles.setFlow(QListView.Flow.LeftToRight)
        self.tiles.setWrapping(False)
        self.tiles.setIconSize(QSize(THUMB_PX, THUMB_PX))
        self.tiles.setMovement(QListView.Movement.Static)
        self.tiles.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.tiles.setGridSize(QSize(THUMB_PX + 48, THUMB_PX + 22))
        self.tiles.setFixedHeight(TILE_HEIGHT)
        self.tiles.setSelectionMode(QListWidget.SelectionMode.NoSelection)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label, 1)
        row.addWidget(self.remove_button)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.addLayout(row)
        column.addWidget(self.tiles)
        self._show()

    def add(self, attachments: Sequence[Attachment]) -> None:
        names = {a.name for a in attachments}
        self.pending = [a for a in self.pending if a.name not in names] + list(attachments)  # a re-attach replaces
        self._show()

    def take(self) -> list[Attachment]:
        taken, self.pending = self.pending, []
        self._show()
        return taken

    def clear(self) -> None:
        self.take()

    @property
    def images(self) -> list[Attachment]:
        return [a for a in self.pending if a.kind == "image"]

    def _show(self) -> None:
        self.tiles.clear()
        words = []
        for attachment in self.pending:
            item = self._tile(attachment)
            self.tiles.addItem(item)
            shown = attachment.kind != "image" or item.data(Qt.ItemDataRole.UserRole)
            words.append(describe(attachment) if shown else f"{attachment.name} ({BROKEN_NOTE})")
        self.label.setText("With your next message: " + "; ".join(words))
        self.tiles.setVisible(bool(self.pending))
        self.setVisible(bool(self.pending))

    def _tile(self, attachment: Attachment) -> QListWidgetItem:
        """The file's tile: a thumbnail, or a warning icon for an image that cannot be decoded, or a file icon."""
        style = self.style()
        item = QListWidgetItem(attachment.name)
        item.setToolTip(describe(attachment))
        if attachment.kind != "image":
            item.setIcon(style.standardIcon(QStyle.StandardPixmap.SP_FileIcon))
            return item
        image = thumbnail(attachment.data)
        if image is None:  # the name stays, with a warning icon and why in its tooltip
            item.setIcon(style.standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning))
            item.setToolTip(f"{attachment.name}: {BROKEN_NOTE}")
        else:
            item.setIcon(QIcon(QPixmap.fromImage(image)))
        item.setData(Qt.ItemDataRole.UserRole, image is not None)  # whether a thumbnail is shown
        return item
