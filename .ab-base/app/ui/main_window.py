"""The Studio window: navigation on the left, one pane at a time, what is loaded in the status bar."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from PySide6.QtCore import QSize, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.studio.gpu_support import GpuSupport, gpu_support
from app.studio.remote_engine import RemoteEngine
from app.studio.runtime import RuntimeStatus, engine_config
from app.studio.server_control import ServerError
from app.studio.tasks import TaskResult
from app.ui.context import StudioContext
from app.ui.panes import PANES, PaneSpec
from app.ui.widgets.about import AboutDialog
from app.ui.widgets.gpu_banner import GpuBanner
from app.ui.widgets.settings_form import SettingsDialog
from app.ui.widgets.status_bar import RuntimeStatusBar
from app.ui.widgets.wheel_guard import guard_wheel

log = logging.getLogger(__name__)

WINDOW_TITLE = "Paddock Studio"
# what a remote engine leaves nothing to do for: loading local models (and their fit), serving the local one
LOCAL_ONLY_PANES = ("models", "server")
MEMORY_POLL_MS = 2000
ICON_PATH = Path(__file__).resolve().parents[2] / "resources" / "icons" / "paddock.png"


class MainWindow(QMainWindow):
    def __init__(self, context: StudioContext, panes: list[PaneSpec] | None = None) -> None:
        super().__init__()
        self.context = context
        self.setWindowTitle(WINDOW_TITLE)
        if ICON_PATH.is_file():
            self.setWindowIcon(QIcon(str(ICON_PATH)))
        self.navigation = QListWidget()
        self.navigation.setObjectName("navigation")
        self.navigation.setFixedWidth(150)
        self.stack = QStackedWidget()
        self.panes: dict[str, QWidget] = {}
        for spec in panes if panes is not None else PANES:
            if context.remote is None or spec.key not in LOCAL_ONLY_PANES:
                self._add_pane(spec)
        self.navigation.currentRowChanged.connect(self.stack.setCurrentIndex)
        self.navigation.setCurrentRow(0)
        central = QWidget()
        layout = QHBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.navigation)
        layout.addWidget(self.stack, 1)
        self.gpu_banner = GpuBanner()
        outer = QWidget()
        column = QVBoxLayout(outer)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.gpu_banner)
        column.addWidget(central, 1)
        self.setCentralWidget(outer)

        self.status = RuntimeStatusBar()
        self.setStatusBar(self.status)
        context.runtime.status_changed.connect(self._on_runtime)
        self._on_runtime(context.runtime.status)
        context.worker.bridge.on_error = self.report_error
        self._memory_timer = QTimer(self)
        self._memory_timer.timeout.connect(self.refresh_memory)
        self._memory_timer.start(MEMORY_POLL_MS)
        self.refresh_memory()
        self.gpu: GpuSupport | None = None  # what the engine can run on, for Help → About
        context.worker.submit(lambda ctx: gpu_support(), on_done=self._on_gpu_support, owner=self)
        self.settings_dialog: SettingsDialog | None = None
        self.about_dialog: AboutDialog | None = None
        self._build_menu()
        self.resize(QSize(1280, 800))
        self._closed = False

    def _add_pane(self, spec: PaneSpec) -> None:
        pane = spec.build(self.context)
        pane.setObjectName(f"pane:{spec.key}")
        guard_wheel(pane)
        self.panes[spec.key] = pane
        self.stack.addWidget(pane)
        wanted = getattr(pane, "chat_model_wanted", None)
        if wanted is not None:
            wanted.connect(self.show_recommended)
        item = QListWidgetItem(spec.title)
        item.setToolTip(spec.tooltip)
        self.navigation.addItem(item)

    def _build_menu(self) -> None:
        studio = self.menuBar().addMenu("&Studio")
        settings = self.settings_action = QAction("&Settings…", self)
        # Ctrl+, everywhere (the platform's Preferences key is empty on most Linux desktops)
        settings.setShortcuts([QKeySequence("Ctrl+,"),
                               *QKeySequence.keyBindings(QKeySequence.StandardKey.Preferences)])
        settings.triggered.connect(self.open_settings)
        quit_action = QAction("&Quit", self, shortcut=QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)
        studio.addActions([settings, quit_action])
        chat = self.menuBar().addMenu("&Chat")
        new_chat = QAction("&New chat", self, shortcut=QKeySequence("Ctrl+N"))
        new_chat.triggered.connect(self.new_chat)
        chat.addAction(new_chat)
        view = self.menuBar().addMenu("&View")
        for number, key in enumerate(list(self.panes)[:9], start=1):  # Ctrl+1..6: the panes in order
            go = QAction(self.navigation.item(number - 1).text(), self, shortcut=QKeySequence(f"Ctrl+{number}"))
            go.triggered.connect(lambda _=False, k=key: self.show_pane(k))
            view.addAction(go)
        model = self.menuBar().addMenu("&Model")
        load = QAction("Load the &start-up model", self)
        load.triggered.connect(lambda: self.load_model())
        unload = QAction("&Unload", self)
        unload.triggered.connect(lambda: self.context.host.unload())
        model.addActions([load, unload])
        help_menu = self.menuBar().addMenu("&Help")
        about = self.about_action = QAction("&About Paddock Studio", self)
        about.setMenuRole(QAction.MenuRole.AboutRole)
        about.triggered.connect(self.open_about)
        help_menu.addAction(about)

    # -- public -----------------------------------------------------------------------------
    def pane(self, key: str) -> QWidget:
        return self.panes[key]

    def show_pane(self, key: str) -> None:
        self.navigation.setCurrentRow(list(self.panes).index(key))

    def new_chat(self) -> None:
        if "chat" in self.panes:
            self.show_pane("chat")
            self.panes["chat"].new_chat()
            self.panes["chat"].input.setFocus()

    def show_recommended(self) -> None:
        """The Models pane's hub tab on its recommended chat models."""
        if "models" in self.panes:
            self.show_pane("models")
            self.panes["models"].show_recommended()

    def load_model(self, model: str | None = None, **overrides: object) -> None:
        """Load `model` (a path, a name in the models folder, "default"; None: the start-up setting).

        `overrides` replace EngineConfig fields for this load only (the command line's --device).
        With a remote engine, connect to it instead (on the worker: it lists the server's models).
        """
        if self.context.remote_problem is not None:
            self.status.show_error(self.context.remote_problem)
            return
        if self.context.remote is not None:
            remote = self.context.remote
            self.status.state.setText(f"Connecting to the remote engine at {remote.host}…")
            self.context.worker.submit(lambda ctx: remote.connect(), on_done=self._on_remote, owner=self)
            return
        try:
            config = engine_config(self.context.settings, model, self.context.models_dir)
            config = dataclasses.replace(config, **overrides)
        except (ValueError, TypeError) as exc:  # a bad setting value: say which
            self.status.show_error(f"Cannot load the model: {exc}")
            return
        self.context.host.load(config)

    def _on_remote(self, result: TaskResult[RemoteEngine]) -> None:
        if result.ok and result.value is not None:
            self.context.host.adopt(result.value)  # the status bar names it: "Device: remote: host:port"
        else:
            self.status.show_error(f"Remote engine: {result.error_message}")

    def open_settings(self) -> None:
        """Window-modal, not a nested event loop: the answer streaming behind it keeps streaming."""
        if self.settings_dialog is not None and self.settings_dialog.isVisible():
            self.settings_dialog.raise_()
            return
        self.settings_dialog = SettingsDialog(self.context.settings, self.context.secrets, self, self.context.dialogs)
        self.settings_dialog.open()

    def open_about(self) -> None:
        if self.about_dialog is not None and self.about_dialog.isVisible():
            self.about_dialog.raise_()
            return
        self.about_dialog = AboutDialog(self.context.paths, self.context.models_dir, self.gpu, self)
        self.about_dialog.open()

    def _on_gpu_support(self, result: TaskResult[GpuSupport]) -> None:
        if result.ok:
            self.gpu = result.value
        if self.context.settings.get("engine.device") != "cpu":  # asked for the CPU: nothing to explain
            self.gpu_banner.show_support(result)

    def refresh_memory(self) -> None:
        self.status.show_memory(self.context.host.memory())

    # -- events -----------------------------------------------------------------------------
    def _on_runtime(self, status: RuntimeStatus) -> None:
        self.status.show_status(status)
        self.refresh_memory()

    def report_error(self, exc: BaseException) -> None:
        log.error("unexpected error in the Studio", exc_info=exc)
        self.status.show_error(f"Something went wrong: {exc or type(exc).__name__}")

    def closeEvent(self, event: QCloseEvent) -> None:
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        """Stop everything that runs in the background: answers, jobs, the API, the engine. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._memory_timer.stop()
        ctx = self.context
        ctx.chat.stop()
        ctx.worker.cancel_all()
        for pane in self.panes.values():
            stop = getattr(pane, "shutdown", None)
            if callable(stop):
                stop()
        try:
            ctx.server.stop()
        except ServerError as exc:
            log.warning("%s", exc)
        ctx.runtime.close()
        ctx.host.shutdown()
        ctx.worker.executor.shutdown()
