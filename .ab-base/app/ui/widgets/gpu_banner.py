"""The line across the top of the window when the engine runs on the CPU: why, and which driver the GPU needs."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QWidget

from app.studio.gpu_support import GpuSupport
from app.studio.tasks import TaskResult


class GpuBanner(QLabel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("gpuBanner")
        self.setWordWrap(True)
        self.setStyleSheet("QLabel#gpuBanner { background: #fff3cd; color: #5c4400; padding: 6px 10px; }")
        self.hide()

    def show_support(self, result: TaskResult[GpuSupport]) -> None:
        """Show the CPU banner (or nothing: the GPU is usable, or the probe itself failed)."""
        text = result.value.banner() if result.ok and result.value is not None else None
        self.setText(text or "")
        self.setVisible(text is not None)
