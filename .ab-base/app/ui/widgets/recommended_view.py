"""Recommended models: the curated list with sizes, what each does and this machine's fit verdicts, one click
to download.

The hub tab opens on it, and the Chat pane's base-model note leads here. The verdicts are
computed on the worker (reading free memory and measuring memory bandwidth take a moment), with
the same settings as the Models pane's fit view: each at the context the chat will use, with the
model's maximum and the speed to expect beside it (a task model, an embedder or a reranker, is judged as the
engine runs one beside the chat model, and has no decode speed). Picking a row shows its memory breakdown
in the hub tab's fit panel.
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

from app.engine.plan.fit import format_bytes, is_task_job
from app.studio.recommendations import RECOMMENDED, Recommendation, RecommendationFit
from app.studio.tasks import TaskResult

HEADERS = ("Model", "For", "Download", "Fit at the chat's context", "Speed here", "Does", "")
FIT_COLUMN, SPEED_COLUMN, JOB_COLUMN = 3, 4, 5
NO_SPEED = "—"  # a task model: it embeds or scores whole texts, it does not generate


class RecommendedView(QWidget):
    download_requested = Signal(object)  # Recommendation
    fit_selected = Signal(object)  # RecommendationFit: a row was picked once its verdict is known

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.intro = QLabel("Models that run in this engine: instruction-tuned chat models by the GPU memory they "
                            "suit, then embedding and reranking models to run beside them. Fit verdicts are for "
                            "this machine, before anything is downloaded.")
        self.intro.setWordWrap(True)
        self.table = QTableWidget(len(RECOMMENDED), len(HEADERS))
        self.table.setHorizontalHeaderLabels(list(HEADERS))
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)  # a verdict wrapped into a row's height was cut off
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(FIT_COLUMN, QHeaderView.ResizeMode.Stretch)  # the verdict and its context
        self.get_buttons: list[QPushButton] = []
        self.fits: list[RecommendationFit] = []
        for row, rec in enumerate(RECOMMENDED):
            cells = (rec.title, rec.memory_class, format_bytes(rec.size_bytes), "", "", rec.job)
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
        self.table.currentCellChanged.connect(lambda row, *_: self._on_row(row))

    def _on_row(self, row: int) -> None:
        if 0 <= row < len(self.fits):
            self.fit_selected.emit(self.fits[row])

    def show_fits(self, result: TaskResult[list[RecommendationFit]]) -> None:
        if not result.ok or result.value is None:
            for row in range(self.table.rowCount()):
                self.table.item(row, FIT_COLUMN).setText("unknown")
            self.intro.setToolTip(result.error_message or "")
            return
        self.fits = list(result.value)
        for row, fit in enumerate(self.fits):
            self.table.item(row, FIT_COLUMN).setText(verdict_text(fit))
            self.table.item(row, FIT_COLUMN).setToolTip(fit.report.summary())
            speed = self.table.item(row, SPEED_COLUMN)
            task = is_task_job(fit.recommendation.job)
            speed.setText(NO_SPEED if task else fit.speed.short() if fit.speed is not None else "unknown")
            speed.setToolTip(fit.speed.describe() if fit.speed is not None else "")
        self._on_row(self.table.currentRow())

    def recommendation(self, row: int) -> Recommendation:
        return RECOMMENDED[row]


def verdict_text(fit: RecommendationFit) -> str:
    """"FITS at 8k (max 128k)": tokens of context; where less than that fits, how much does (one short line:
    the whole sentence is the cell's tooltip and the fit panel's)."""
    report = fit.report
    text = (f"{report.verdict.upper()} at {tokens_short(report.context_length)} "
            f"(max {tokens_short(report.model_context_length)})")
    if report.budget_bytes is not None and report.max_context < report.context_length:
        text += f" · up to {tokens_short(report.max_context)} fit" if report.max_context else ""
    return text


def tokens_short(count: int) -> str:
    """A context length as models are named by it: 8192 -> "8k", 131072 -> "128k"; others in full."""
    return f"{count // 1024}k" if count >= 1024 and count % 1024 == 0 else f"{count:,}"
