"""Will-it-fit, shown: the verdict as a coloured badge at the context the chat will use (the model's maximum
beside it), the memory breakdown (a speech model's audio tower, the task models loaded beside a chat model),
the largest context that fits, and the speed to expect on this machine."""

from __future__ import annotations

from PySide6.QtWidgets import QFormLayout, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.engine.plan.fit import FitReport, format_bytes
from app.studio.fit_estimate import DecodeSpeed, FitEstimate
from app.studio.tasks import TaskResult

PARTS = (("weights", "Weights"), ("vision", "Vision"), ("audio", "Audio"), ("kv_cache", "KV cache"),
         ("activations", "Activations"), ("overhead", "Overhead"))
VISION_ROW = 1  # shown only for a model that takes images
AUDIO_ROW = 2  # shown only for a model with an audio side (a speech model, Gemma 4 with audio)


class FitView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.verdict = QLabel()
        self.verdict.setObjectName("verdict")
        self.headline = QLabel()
        self.headline.setWordWrap(True)
        self.parts = {key: QLabel() for key, _ in PARTS}
        self.total = QLabel()
        self.max_context = QLabel()
        self.max_context.setWordWrap(True)
        self.speed = QLabel()  # "Expected speed here: ~3.2 tokens/s: slow …"
        self.speed.setWordWrap(True)
        top = QHBoxLayout()
        top.addWidget(self.verdict)
        top.addWidget(self.headline, 1)
        form = self.form = QFormLayout()
        for key, title in PARTS:
            form.addRow(title, self.parts[key])
        form.addRow("Total", self.total)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addLayout(form)
        layout.addWidget(self.max_context)
        layout.addWidget(self.speed)
        self.report: FitReport | None = None
        self.clear()

    def clear(self, text: str = "Select a model to see whether it fits.") -> None:
        self.report = None
        self._set_verdict("")
        self.headline.setText(text)
        for label in (*self.parts.values(), self.total, self.max_context, self.speed):
            label.setText("")
        self._set_slow(False)
        self.form.setRowVisible(VISION_ROW, False)
        self.form.setRowVisible(AUDIO_ROW, False)

    def show_pending(self, text: str) -> None:
        self.clear(text)

    def show_error(self, text: str) -> None:
        self.clear(text)
        self.headline.setObjectName("errorText")
        self._repolish(self.headline)

    def show_result(self, result: TaskResult[FitEstimate]) -> None:
        """The outcome of a background fit check: the report and speed, or why there is none."""
        if result.ok and result.value is not None:
            self.show_report(result.value.report, result.value.speed)
        else:
            self.show_error(f"Cannot tell whether it fits: {result.error_message}")

    def show_report(self, report: FitReport, speed: DecodeSpeed | None = None) -> None:
        self.report = report
        self.headline.setObjectName("")
        self._repolish(self.headline)
        self._set_verdict(report.verdict)
        budget = f"{format_bytes(report.budget_bytes)} usable" if report.budget_bytes is not None else "unknown"
        self.headline.setText(
            f"{format_bytes(report.total)} needed at {report.context_length:,} tokens of context "
            f"(the model's maximum: {report.model_context_length:,}; {report.kv_dtype} KV); {budget} on "
            f"{report.device.describe()}.")
        for key, _ in PARTS:
            self.parts[key].setText(format_bytes(getattr(report.breakdown, key)))
        if report.vision_source:
            b = report.breakdown
            self.parts["vision"].setText(f"{format_bytes(b.vision)} ({format_bytes(b.vision_weights)} in "
                                         f"{report.vision_source}, {format_bytes(b.vision_activations)} per image)")
        self.form.setRowVisible(VISION_ROW, bool(report.vision_source))
        if report.audio_source:
            b = report.breakdown
            self.parts["audio"].setText(f"{format_bytes(b.audio)} ({format_bytes(b.audio_weights)} of encoder, "
                                        f"projector and adapter: {report.audio_source}; "
                                        f"{format_bytes(b.audio_activations)} per {report.audio_clip})")
        self.form.setRowVisible(AUDIO_ROW, bool(report.audio_source))
        beside = "; ".join(f"{format_bytes(t.total)} for the {t.job} model {t.name} beside it" for t in report.beside)
        self.total.setText(format_bytes(report.total) + (f" ({beside})" if beside else ""))
        if report.budget_bytes is None:
            self.max_context.setText("")
        elif report.max_context:
            self.max_context.setText(f"Largest context that fits: {report.max_context:,} tokens "
                                     f"(model maximum {report.model_context_length:,}).")
        else:
            self.max_context.setText("Not even a short context fits: the weights alone are too large.")
        self.speed.setText(speed.describe() if speed is not None else "")
        self._set_slow(speed is not None and speed.slow)

    def _set_slow(self, slow: bool) -> None:
        self.speed.setObjectName("hintText" if slow else "")  # "fits but slow" stands out
        self._repolish(self.speed)

    def _set_verdict(self, verdict: str) -> None:
        self.verdict.setText(verdict.upper() if verdict else "")
        self.verdict.setVisible(bool(verdict))
        self.verdict.setProperty("verdict", verdict)
        self._repolish(self.verdict)

    @staticmethod
    def _repolish(label: QLabel) -> None:
        label.style().unpolish(label)
        label.style().polish(label)
