"""The hub tab when the hub does not answer: said beside the search box within HUB_WAIT_MS (5 s), with a
Retry; Cancel stops a search in progress. The "hub" is a local socket that accepts and never replies."""

from __future__ import annotations

import socket
import threading

import pytest
from PySide6.QtCore import Qt

from app.ui.widgets.hub_browser import HUB_WAIT_MS


@pytest.fixture
def silent_hub(monkeypatch):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])  # kept open, never answered
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    yield endpoint
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    server.close()


def _browser(make_window):
    window = make_window(panes=("models",), threaded=True)
    return window.pane("models").hub


def test_a_hub_that_never_answers_is_reported_beside_the_search_box(qtbot, make_window, silent_hub):
    browser = _browser(make_window)
    browser.query.setText("qwen")
    qtbot.mouseClick(browser.search_button, Qt.MouseButton.LeftButton)
    assert browser.searching and browser.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: browser.search_note.isVisibleTo(browser), timeout=HUB_WAIT_MS + 2000)
    assert silent_hub in browser.search_note.text() and "does not answer" in browser.search_note.text()
    assert browser.retry_button.isVisibleTo(browser) and not browser.searching
    assert browser.left.currentWidget() is browser.recommended  # what is known offline is still shown
    assert browser.search_note.parentWidget() is browser  # in the tab, under the search row, not a status bar

    qtbot.mouseClick(browser.retry_button, Qt.MouseButton.LeftButton)  # tries again
    assert browser.searching and not browser.search_note.isVisibleTo(browser)
    qtbot.mouseClick(browser.cancel_button, Qt.MouseButton.LeftButton)
    assert not browser.searching and browser.status.text() == "Search cancelled."
    assert not browser.cancel_button.isEnabled()
