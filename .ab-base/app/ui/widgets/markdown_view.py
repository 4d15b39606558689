"""One answer shown as rendered Markdown (or raw), each code block with a working Copy link.

Links to http(s) open in the browser; a code block's Copy link uses a scheme named at
random per view, so nothing in the answer itself can pose as one.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QTextBrowser, QWidget

from app.studio.markdown import render_markdown


class MarkdownView(QTextBrowser):
    def __init__(self, copy_text: Callable[[str], None] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._copy = copy_text or (lambda text: None)
        self._scheme = "code" + secrets.token_hex(6)
        self.code_blocks: tuple[str, ...] = ()
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._on_link)

    def show_markdown(self, text: str, raw: bool = False) -> None:
        if raw or not text:
            self.code_blocks = ()
            self.setPlainText(text)
            return
        rendered = render_markdown(text, lambda n: f"{self._scheme}:{n}")
        self.code_blocks = rendered.code_blocks
        self.setHtml(rendered.html)

    def _on_link(self, url: QUrl) -> None:
        if url.scheme() == self._scheme:
            self._copy(self.code_blocks[int(url.path())])
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)
