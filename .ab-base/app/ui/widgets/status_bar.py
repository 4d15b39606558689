"""The window's status bar: what is loaded (model, quantization, context, device) and the memory in use."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from app.studio.runtime import MemoryUse, RuntimeStatus
from app.ui.widgets.elided_label import ElidedLabel


class RuntimeStatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setSizeGripEnabled(False)
        self.state = ElidedLabel()  # a long error is shortened here, never widens the window
        self.state.setObjectName("runtimeState")
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)  # indeterminate: loading has no byte count to show
        self.busy.setMaximumWidth(90)
        self.busy.setTextVisible(False)
        self.busy.hide()
        self.model = QLabel()
        self.quantization = QLabel()
        self.context = QLabel()
        self.device = QLabel()
        self.memory = QLabel()
        self.memory.setToolTip("Memory the Studio uses now: RAM of this process, the GPU's share, "
                               "and how full the KV cache is")
        self.addWidget(self.busy)
        self.addWidget(self.state, 1)
        for label in (self.model, self.quantization, self.context, self.device, self.memory):
            label.setObjectName("statusField")
            self.addPermanentWidget(label)
        self.show_status(RuntimeStatus("empty", "No model loaded"))

    def show_status(self, status: RuntimeStatus) -> None:
        self.busy.setVisible(status.busy)
        self.state.setText(status.message)
        self.state.setProperty("error", status.state == "error" or bool(status.problem))
        self.state.style().unpolish(self.state)  # re-read the stylesheet for the new property
        self.state.style().polish(self.state)
        loaded = status.ready
        self.model.setText(f"Model: {status.model}" if loaded else "Model: none")
        self.quantization.setText(f"Quant: {status.quantization}" if loaded else "")
        self.context.setText(f"Context: {status.context_length:,} tokens" if loaded and status.context_length
                             else "")
        self.device.setText(f"Device: {status.device}" if loaded else "")
        for label in (self.quantization, self.context, self.device):
            label.setVisible(bool(label.text()))

    def show_memory(self, memory: MemoryUse) -> None:
        self.memory.setText(f"Memory: {memory.describe()}")

    def show_error(self, text: str) -> None:
        """A problem that is not the model's (a failed callback): shown until the next status change."""
        self.state.setText(text)
        self.state.setProperty("error", True)
        self.state.style().unpolish(self.state)
        self.state.style().polish(self.state)
