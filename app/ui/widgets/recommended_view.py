"""Recommended chat models: the curated list with sizes and this machine's fit verdicts, one click to download.

The hub tab opens on it, and the Chat pane's base-model note leads here. The verdicts are
computed on the worker (reading free memory can take a moment), with the same settings
as the Models pane's fit view.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.engine.plan.fit import format_bytes
from app.studio.recommendations import RECOMMENDED, Recommendation, RecommendationFit
from app.studio.tasks import TaskResult

HEADERS = ("Model", "For", "Download", "Fit on this machine", "")


class RecommendedView(QWidget):
    download_requested = Signal(object)  # Recommendation

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.intro = QLabel("Instruction-tuned chat models that run in this engine, by the GPU memory they suit. "
                            "Fit verdicts are for this machine, before anything is downloaded.")
        self.intro.setWordWrap(True)
        self.table = QTableWidget(len(RECOMMENDED), len(HEADERS))
        self.table.setHorizontalHeaderLabels(list(HEADERS))
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)  # the verdict and its context
        self.get_buttons: list[QPushButton] = []
        for row, rec in enumerate(RECOMMENDED):
            cells = (rec.title, rec.memory_class, format_bytes(rec.size_bytes), "")
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(f"{rec.repo_id} · {rec.file}" + (f"\n{rec.note}" if rec.note else ""))
                self.table.setItem(row, column, item)
            button = QPushButton("Get")
            button.setToolTip(f"Download {rec.file} from {rec.repo_id} into the models folder")
            button.clicked.connect(lambda _=False, r=rec: self.download_requested.emit(r))
            self.table.setCellWidget(row, len(HEADERS) - 1, button)
            self.get_buttons.append(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.intro)
        layout.addWidget(self.table, 1)

    def show_fits(self, result: TaskResult[list[RecommendationFit]]) -> None:
        if not result.ok or result.value is None:
            for row in range(self.table.rowCount()):
                self.table.item(row, 3).setText("unknown")
            self.intro.setToolTip(result.error_message or "")
            return
        for row, fit in enumerate(result.value):
            report = fit.report
            text = report.verdict.upper()
            if report.budget_bytes is not None and report.max_context < report.context_length:
                text += f" · up to {report.max_context:,} tokens" if report.max_context else ""
            self.table.item(row, 3).setText(text)
            self.table.item(row, 3).setToolTip(report.summary())

    def recommendation(self, row: int) -> Recommendation:
        return RECOMMENDED[row]
