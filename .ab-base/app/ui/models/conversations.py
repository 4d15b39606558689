"""The conversations list of the Chat pane: History's conversations, most recent first."""

from __future__ import annotations

import datetime as dt
from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt

from app.studio.history import Conversation

UNTITLED = "New conversation"
Index = QModelIndex | QPersistentModelIndex


class ConversationListModel(QAbstractListModel):
    def __init__(self) -> None:
        super().__init__()
        self._items: list[Conversation] = []

    def replace(self, conversations: list[Conversation]) -> None:
        self.beginResetModel()
        self._items = list(conversations)
        self.endResetModel()

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        conversation = self._items[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return conversation.title or UNTITLED
        if role == Qt.ItemDataRole.ToolTipRole:
            when = dt.datetime.fromtimestamp(conversation.updated_at).strftime("%Y-%m-%d %H:%M")
            return f"{conversation.title or UNTITLED}\n{conversation.model or 'no model'} · {when}"
        if role == Qt.ItemDataRole.UserRole:
            return conversation.id
        return None

    def conversation_at(self, row: int) -> Conversation | None:
        return self._items[row] if 0 <= row < len(self._items) else None

    def row_of(self, conversation_id: int) -> int:
        return next((i for i, c in enumerate(self._items) if c.id == conversation_id), -1)
