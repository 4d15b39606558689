"""Help → About: what this Studio is (version, licence), what it runs on, and where it keeps things.

The folders are the ones a user is asked about most (where are my models, my settings, my
chats?); the engine line is the same probe `paddock --version` prints, taken once at start.
"""

from __future__ import annotations

import html
import platform
from pathlib import Path

from PySide6 import __version__ as PYSIDE_VERSION
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QVBoxLayout, QWidget

from app import __version__
from app.studio.gpu_support import GpuSupport
from app.studio.paths import StudioPaths

README = Path(__file__).resolve().parents[3] / "README.md"


def about_html(paths: StudioPaths, models_dir: Path, gpu: GpuSupport | None) -> str:
    engine = f"{gpu.backend}: {gpu.reason}" if gpu is not None else "being checked…"
    rows = [("Version", __version__), ("Engine", engine),
            ("Models folder", str(models_dir)), ("Settings", str(paths.settings_file)),
            ("Chats (history)", str(paths.history_db)), ("Cache (safe to delete)", str(paths.cache_dir)),
            ("Runs on", f"Python {platform.python_version()}, Qt for Python {PYSIDE_VERSION}, {platform.system()}")]
    if README.is_file():
        rows.append(("Guide", f'<a href="{README.as_uri()}">README.md</a>'))
    table = "".join(f"<tr><td><b>{html.escape(k)}</b>&nbsp;&nbsp;</td><td>{v if k == 'Guide' else html.escape(v)}"
                    "</td></tr>" for k, v in rows)
    return ("<h3>Paddock Studio</h3><p>Chat with, compare and serve open LLMs on your own machine, on an "
            f"inference engine of its own. Apache-2.0 licence.</p><table>{table}</table>")


class AboutDialog(QDialog):
    def __init__(self, paths: StudioPaths, models_dir: Path, gpu: GpuSupport | None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About Paddock Studio")
        self.text = QLabel(about_html(paths, models_dir, gpu))
        self.text.setWordWrap(True)
        self.text.setOpenExternalLinks(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)  # paths can be copied
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.text)
        layout.addWidget(buttons)
        self.resize(620, 320)
