"""The composition root: build the services once, hand them to the window, run Qt on a qasync loop.

Everything the panes use is created here and passed down (`StudioContext`); tests build
the same context with fakes through `build_context`'s parameters.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.studio.chat import ChatService
from app.studio.doc_qa import embedder_source as doc_qa_embedder
from app.studio.embedders import EmbedderHost, EmbedderSource
from app.studio.history import History
from app.studio.library import ModelLibrary
from app.studio.ocr import OcrHost, installed_ocr_source, ocr_source
from app.studio.paths import StudioPaths, studio_paths
from app.studio.remote_engine import RemoteEngine, RemoteEngineError
from app.studio.runtime import EngineFactory, EngineHost, default_factory
from app.studio.secrets import REMOTE_ENGINE_API_KEY, SecretStore
from app.studio.server_control import ServerControl
from app.studio.settings import Settings
from app.studio.tasks import SyncExecutor, ThreadExecutor
from app.ui.context import RuntimeWatcher, StudioContext
from app.ui.widgets.dialogs import Dialogs
from app.ui.workers import UiBridge, Worker, install_asyncgen_hooks

log = logging.getLogger(__name__)
DESKTOP_FILE_NAME = "paddock-studio"  # matches resources/paddock-studio.desktop, for the taskbar icon


def build_context(paths: StudioPaths, *, engine_factory: EngineFactory = default_factory,
                  executor: ThreadExecutor | SyncExecutor | None = None,
                  host_executor: ThreadExecutor | SyncExecutor | None = None, dialogs: Dialogs | None = None,
                  copy_text: Callable[[str], None] | None = None, use_keyring: bool = True,
                  embedder_source: EmbedderSource | None = None,
                  remote_url: str | None = None, ocr: OcrHost | None = None) -> StudioContext:
    """The Studio's services over the folders in `paths` (call on the Qt thread, after QApplication exists).

    `remote_url` (default: the engine.remote_url setting) puts an OpenAI-compatible server in place of
    the local engine; it is connected to by `MainWindow.load_model`, off the UI thread. `ocr` (default:
    the documents.ocr_model setting's) reads scanned PDF pages as documents are added."""
    paths.ensure()
    settings = Settings.load(paths.settings_file)
    secrets = SecretStore(settings, use_keyring=use_keyring)
    remote, remote_problem = None, None
    url = remote_url if remote_url is not None else settings.get("engine.remote_url")
    if url:
        try:
            remote = RemoteEngine(url, secrets.get(REMOTE_ENGINE_API_KEY), settings.get("engine.remote_model") or None)
        except RemoteEngineError as exc:
            remote_problem = f"Remote engine: {exc}"
        else:
            embedder_source = remote.embedder  # Documents embed on the remote too
    history = History(paths.history_db)
    worker = Worker(UiBridge(), executor)
    host = EngineHost(engine_factory, executor=host_executor)
    # the Studio's embedder setting: "" the shipped MiniLM, else a Qwen3-Embedding or BERT folder / GGUF
    embedders = EmbedderHost(embedder_source or doc_qa_embedder(settings.get("documents.embedding_model"),
                                                                settings.get("engine.device")))
    if ocr is None:  # the setting's OCR model, else a PaddleOCR-VL of the models folder once one is there
        ocr_path, device = settings.get("documents.ocr_model"), settings.get("engine.device")
        if ocr_path:
            ocr = OcrHost(ocr_source(ocr_path, device), Path(ocr_path).name)
        else:
            def installed() -> list:
                return ModelLibrary(settings.get("models.folder") or paths.models_dir, paths.other_models).list()

            ocr = OcrHost(installed_ocr_source(installed, device))
    server = ServerControl(lambda: host.client, embedder=lambda: embedders.loaded)
    server.follow(host)
    server.follow_embedder(embedders)  # /v1/embeddings once the Documents pane has loaded the model
    return StudioContext(
        paths=paths, settings=settings, secrets=secrets, history=history,
        host=host, chat=ChatService(history, lambda: host.client), server=server, worker=worker,
        runtime=RuntimeWatcher(host, worker), dialogs=dialogs or Dialogs(),
        copy_text=copy_text or (lambda text: None), embedders=embedders, remote=remote,
        remote_problem=remote_problem, ocr=ocr,
    )


def configure_application(app: Any) -> None:
    """Names the desktop uses: the .desktop entry (taskbar icon, grouping) and the application's name."""
    from PySide6.QtGui import QGuiApplication, QIcon

    from app.ui.main_window import ICON_PATH

    QGuiApplication.setDesktopFileName(DESKTOP_FILE_NAME)
    app.setApplicationName("Paddock Studio")
    app.setApplicationDisplayName("Paddock Studio")
    if ICON_PATH.is_file():
        app.setWindowIcon(QIcon(str(ICON_PATH)))


def run_studio(model: str | None = None, home: str | os.PathLike[str] | None = None,
               argv: list[str] | None = None, engine_url: str | None = None, **engine_overrides: Any) -> int:
    """Open the window and run until it closes; returns the exit status."""
    import qasync
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QApplication

    from app.ui.gc_guard import GuiThreadCollector
    from app.ui.main_window import MainWindow
    from app.ui.theme import follow_theme

    app = QApplication(argv or sys.argv[:1])
    configure_application(app)
    collector = GuiThreadCollector(app)  # see gc_guard.py: no collection from worker threads
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    install_asyncgen_hooks(loop)
    context = build_context(studio_paths(home), copy_text=lambda text: QGuiApplication.clipboard().setText(text),
                            remote_url=engine_url)
    stop_theme = follow_theme(app, context.settings)  # a theme chosen in Settings applies at once
    window = MainWindow(context)
    # an error nobody caught becomes a sentence in the status bar, not a traceback in a terminal
    sys.excepthook = lambda kind, value, tb: window.report_error(value)
    window.show()
    window.load_model(model, **{k: v for k, v in engine_overrides.items() if v is not None})
    with loop:
        loop.run_forever()
    window.shutdown()
    stop_theme()
    collector.stop()
    return 0
