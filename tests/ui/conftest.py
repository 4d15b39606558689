"""Fixtures for the Studio's pytest-qt tests: a qasync loop, a Studio context over a temporary home, windows.

Most tests run the Studio over the API tests' fake engine (tests/server/fakes.py:
"Echo: <question>", one character per token; "forever" in a prompt streams "tick "
slowly). Tests marked as needing the real model take `real_engine`: the embedded Gemma 3
270M from tests/conftest.py (loaded once per session), wrapped in a fresh AsyncEngine.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import qasync
from PySide6.QtWidgets import QApplication
from server.fakes import FakeEngine
from studio.fake_openai import fake_servers

from app.studio.paths import studio_paths
from app.studio.tasks import SyncExecutor, ThreadExecutor
from app.ui.context import StudioContext
from app.ui.gc_guard import GuiThreadCollector
from app.ui.main import build_context
from app.ui.main_window import MainWindow
from app.ui.panes import PANES
from app.ui.widgets.dialogs import Dialogs
from app.ui.workers import install_asyncgen_hooks


class ScriptedDialogs(Dialogs):
    """Answers the panes' questions without showing a dialog, and remembers what was asked."""

    def __init__(self) -> None:
        self.confirm_answer = True
        self.save_to: str | None = None
        self.choice: str | None = None  # the button `choose` clicks; None: the box is closed
        self.text_answer: str | None = None  # what `ask_text` types; None: cancelled
        self.open_answer: list[str] = []  # the files `open_paths` picks; empty: cancelled
        self.folder_answer: str | None = None  # the folder `open_folder` picks; None: cancelled
        self.asked: list[str] = []

    def confirm(self, parent: Any, title: str, text: str) -> bool:
        self.asked.append(text)
        return self.confirm_answer

    def choose(self, parent: Any, title: str, text: str, choices: list[str]) -> str | None:
        self.asked.append(text)
        return self.choice

    def ask_text(self, parent: Any, title: str, label: str, text: str) -> str | None:
        self.asked.append(title)
        return self.text_answer

    def save_path(self, parent: Any, title: str, suggested: str, filters: str) -> str | None:
        self.asked.append(title)
        return self.save_to

    def open_folder(self, parent: Any, title: str) -> str | None:
        self.asked.append(title)
        return self.folder_answer

    def open_paths(self, parent: Any, title: str, filters: str) -> list[str]:
        self.asked.append(title)
        return list(self.open_answer)


DRAIN_SECONDS = 5.0  # the longest a test's abandoned streams may take to close at its end


@pytest.fixture(scope="session", autouse=True)
def _gui_thread_collector(qapp) -> Iterator[GuiThreadCollector]:
    """As the Studio runs: cycles are collected on the GUI thread only (app/ui/gc_guard.py)."""
    collector = GuiThreadCollector(qapp)
    yield collector
    collector.stop()
    gc.collect()


@pytest.fixture(scope="session")
def _session_loop(qapp) -> qasync.QEventLoop:
    # already_running: the loop rides on the Qt event processing qtbot does (waitUntil, waitSignal)
    return qasync.QEventLoop(qapp, already_running=True)


@pytest.fixture
def qloop(_session_loop) -> Iterator[qasync.QEventLoop]:
    """The qasync loop as the running asyncio loop for one test; a callback's exception fails the test."""
    errors: list[dict] = []
    _session_loop.set_exception_handler(lambda loop, context: errors.append(context))
    asyncio.events._set_running_loop(_session_loop)
    asyncio.set_event_loop(_session_loop)
    hooks = install_asyncgen_hooks(_session_loop)
    try:
        yield _session_loop
        # streams this test abandoned close now, while the loop is the running one, not in a later test
        deadline = time.monotonic() + DRAIN_SECONDS
        while hooks.pending and time.monotonic() < deadline:
            QApplication.processEvents()
            time.sleep(0.001)
    finally:
        hooks.restore()
        asyncio.events._set_running_loop(None)
        asyncio.set_event_loop(None)  # tests after this one make their own loops
    assert not errors, f"errors on the event loop: {errors}"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "paddock-home"


@pytest.fixture
def copied() -> list[str]:
    return []


@pytest.fixture
def make_context(qloop, home: Path, copied: list[str]) -> Iterator[Callable[..., StudioContext]]:
    """Builds Studio contexts over `home` (call it again for a 'restart'); the engine comes ready-loaded."""
    built: list[StudioContext] = []

    def make(engine: Any = None, threaded: bool = False, **kwargs: Any) -> StudioContext:
        context = build_context(
            studio_paths(home), executor=ThreadExecutor() if threaded else SyncExecutor(),
            host_executor=SyncExecutor(), dialogs=ScriptedDialogs(), copy_text=copied.append, use_keyring=False,
            **kwargs,
        )
        if engine is not None:
            context.host.adopt(engine)
        built.append(context)
        return context

    make.windows = []  # type: ignore[attr-defined] - make_window registers its windows here
    yield make
    for window in make.windows:  # type: ignore[attr-defined]
        window.shutdown()  # stop answers and servers before their History closes
    for context in built:
        context.history.close()


@pytest.fixture
def make_window(qtbot, make_context) -> Callable[..., MainWindow]:
    """A main window with the chosen panes (default: all) over a fresh or given context."""

    def make(context: StudioContext | None = None, panes: tuple[str, ...] | None = None, engine: Any = None,
             **kwargs: Any) -> MainWindow:
        context = context or make_context(engine if engine is not None else FakeEngine(), **kwargs)
        specs = [spec for spec in PANES if panes is None or spec.key in panes]
        window = MainWindow(context, specs)
        qtbot.addWidget(window, before_close_func=lambda w: w.shutdown())
        make_context.windows.append(window)
        return window

    return make


@pytest.fixture
def real_engine(embedded_engine) -> Iterator[Any]:
    """The embedded model behind a fresh AsyncEngine (one engine thread at a time, see tests/conftest.py)."""
    from app.engine.core.async_engine import AsyncEngine

    client = AsyncEngine(engine=embedded_engine)
    yield client
    client.close()


@pytest.fixture
def servers():
    """Starts local OpenAI-compatible test servers (`servers(mode, **options)`), stopped after the test."""
    with fake_servers() as start:
        yield start
