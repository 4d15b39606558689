"""The hub tab when the hub does not answer: said beside the search box within HUB_WAIT_MS (5 s), with a
Retry; Cancel stops a search in progress; Get on a recommended model says the same, never a raw
connection error; each hub call is tried once, so nothing retries (or logs) behind the note, not even
at interpreter exit. The "hub" is a local socket that accepts and never replies, or a closed port."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.studio.downloads import HubClient, HubUnreachable
from app.ui.widgets.hub_browser import HUB_WAIT_MS

ROOT = Path(__file__).resolve().parents[2]


def closed_port_endpoint() -> str:
    """A loopback address nothing listens on: connections are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def closed_hub(monkeypatch) -> str:
    endpoint = closed_port_endpoint()
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    return endpoint


@pytest.fixture
def hanging_up_hub():
    """A hub that accepts each connection and closes it at once; counts the connections it saw."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    seen: list[int] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection = server.accept()[0]
            except OSError:
                continue
            seen.append(1)
            connection.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", seen
    stop.set()
    thread.join()
    server.close()


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


def test_get_offline_shows_the_note_with_retry_not_a_raw_error(qtbot, make_window, closed_hub):
    browser = _browser(make_window)
    browser.show()
    with qtbot.waitSignal(browser.listed, timeout=HUB_WAIT_MS) as listed:  # the note comes within 5 s
        qtbot.mouseClick(browser.recommended.get_buttons[0], Qt.MouseButton.LeftButton)
    assert isinstance(listed.args[0].error, HubUnreachable)
    note = browser.search_note.text()
    assert browser.search_note.isVisibleTo(browser) and browser.retry_button.isVisibleTo(browser)
    assert closed_hub in note and "does not answer" in note and "cannot be listed" in note
    assert "ConnectError" not in note + browser.status.text() + browser.repo.text()  # said in words
    assert browser.left.currentWidget() is browser.recommended and not browser.downloading

    with qtbot.waitSignal(browser.listed, timeout=HUB_WAIT_MS):  # Retry asks again: the same Get
        qtbot.mouseClick(browser.retry_button, Qt.MouseButton.LeftButton)
    assert browser.search_note.isVisibleTo(browser) and "cannot be listed" in browser.search_note.text()


def test_a_refused_search_says_offline_at_once(qtbot, make_window, closed_hub):
    browser = _browser(make_window)
    browser.show()
    browser.query.setText("qwen")
    with qtbot.waitSignal(browser.searched, timeout=HUB_WAIT_MS):
        qtbot.mouseClick(browser.search_button, Qt.MouseButton.LeftButton)
    assert "does not answer" in browser.search_note.text() and browser.retry_button.isVisibleTo(browser)
    assert not browser.searching


def test_each_hub_call_is_tried_once_and_logs_nothing(hanging_up_hub, caplog):
    endpoint, seen = hanging_up_hub
    client = HubClient(endpoint=endpoint)
    with pytest.raises(HubUnreachable, match="cannot reach the Hugging Face hub"):
        client.search("qwen")
    with pytest.raises(HubUnreachable):
        client.list_files("Qwen/Qwen3-4B-GGUF")
    assert len(seen) == 2  # huggingface_hub's own loop retried each five times, logging each retry
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


EXIT_SCRIPT = """
import logging, os, sys
from concurrent.futures import ThreadPoolExecutor
from app.studio.downloads import HubClient

stream = open(os.devnull, "w")  # as pytest's capture: a stream that is closed before the interpreter exits
logging.basicConfig(stream=stream, level=logging.WARNING, force=True)
pool = ThreadPoolExecutor(1)
pool.submit(lambda: [HubClient(endpoint=sys.argv[1]).search("qwen") for _ in range(1)])
pool.shutdown(wait=False)
stream.close()
"""


def test_no_logging_from_a_hub_worker_at_interpreter_exit():
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(EXIT_SCRIPT), closed_port_endpoint()], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "Logging error" not in run.stderr and "Retry" not in run.stderr, run.stderr
