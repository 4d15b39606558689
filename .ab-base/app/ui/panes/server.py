"""The Server pane: the local API toggle, where clients reach it, snippets for IDE agents, a live request log.

Every choice here is saved as it is made (a restart finds the pane as it was left, Start pressed
or not); the API key is saved when its field is left or a key is generated. Changes made in the
Settings dialog show here at once.

Starting and stopping block for a moment (the port opening or closing), so they run
through the worker; the server's state and its request log arrive from other threads
through `Worker.threadsafe`.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.studio.runtime import RuntimeStatus
from app.studio.secrets import SERVER_API_KEY, SecretStore, generate_api_key
from app.studio.server_control import (
    LogEntry,
    ServerControl,
    ServerOptions,
    ServerState,
    Snippet,
    agent_snippets,
    endpoints_for,
)
from app.studio.settings import Settings, SettingsError, declaration
from app.studio.tasks import TaskResult
from app.ui.context import RuntimeWatcher
from app.ui.widgets.copy_field import CopyBlock, CopyLine
from app.ui.widgets.dialogs import Dialogs
from app.ui.widgets.feedback import error_label, show_error
from app.ui.widgets.lan_guard import GENERATE, ask_lan_without_key
from app.ui.workers import Worker

BIND_CHOICES = (("loopback", "This computer only (127.0.0.1)"), ("lan", "Local network (0.0.0.0)"))
LOG_LINES = 500
PANE_SETTINGS = frozenset({"server.port", "server.bind", "server.require_api_key", "engine.prefix_cache",
                           "engine.kv_dtype"})


class ServerPane(QWidget):
    def __init__(self, server: ServerControl, runtime: RuntimeWatcher, settings: Settings, secrets: SecretStore,
                 worker: Worker, copy_text: Callable[[str], None], parent: QWidget | None = None,
                 dialogs: Dialogs | None = None) -> None:
        super().__init__(parent)
        self.dialogs = dialogs or Dialogs()
        self.server, self.runtime, self.settings, self.secrets, self.worker = server, runtime, settings, secrets, worker
        self._copy = copy_text
        self._switching = False  # a start or stop is on its way
        self._loading = False  # the widgets are being filled from the settings: nothing to save
        self._build()
        self._load_settings()
        unsubscribe = settings.subscribe(self._on_setting_changed)
        self.destroyed.connect(lambda *_: unsubscribe())
        server.subscribe(worker.threadsafe(self._show_state, owner=self))
        server.log.subscribe(worker.threadsafe(self._append_log, owner=self))
        runtime.status_changed.connect(self._on_runtime)
        self._show_state(server.state)

    def _build(self) -> None:
        self.toggle = QPushButton("Start API")
        self.toggle.setCheckable(True)
        self.toggle.setMinimumWidth(140)
        self.state = QLabel()
        self.state.setWordWrap(True)
        self.error = error_label(hidden=True)
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.bind = QComboBox()
        for key, label in BIND_CHOICES:
            self.bind.addItem(label, key)
        self.require_key = QCheckBox("Clients must send this key")
        self.api_key = QLineEdit()
        self.api_key.setPlaceholderText("no key set")
        self.generate_key = QPushButton("Generate")
        # the engine settings that matter most for agents' long prompts; they apply at the next model load
        self.prefix_cache = QCheckBox("Reuse prompt prefixes (prefix cache)")
        self.kv_dtype = QComboBox()
        for choice in declaration("engine.kv_dtype").choices:
            self.kv_dtype.addItem(choice, choice)
        self.kv_dtype.setToolTip(declaration("engine.kv_dtype").help)
        self.exposure = QLabel()
        self.exposure.setObjectName("hintText")
        self.exposure.setWordWrap(True)
        key_row = QHBoxLayout()
        key_row.addWidget(self.require_key)
        key_row.addWidget(self.api_key, 1)
        key_row.addWidget(self.generate_key)
        self.openai_url = CopyLine(self._copy)
        self.anthropic_url = CopyLine(self._copy)
        self.lan_url = CopyLine(self._copy)

        settings_box = QGroupBox("API")
        form = QFormLayout(settings_box)
        top = QHBoxLayout()
        top.addWidget(self.toggle)
        top.addWidget(self.state, 1)
        form.addRow(top)
        form.addRow(self.error)
        form.addRow("Port", self.port)
        form.addRow("Listen on", self.bind)
        form.addRow("API key", key_row)
        form.addRow("KV cache", self.prefix_cache)
        form.addRow("KV precision", self.kv_dtype)
        form.addRow(self.exposure)
        urls_box = QGroupBox("Base URLs")
        self.urls = QFormLayout(urls_box)
        self.urls.addRow("OpenAI clients", self.openai_url)
        self.urls.addRow("Anthropic clients", self.anthropic_url)
        self.urls.addRow("From other machines", self.lan_url)

        self.snippets = QTabWidget()
        self.snippet_blocks: dict[str, CopyBlock] = {}
        self.log = QPlainTextEdit()
        self.log.setObjectName("requestLog")
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(LOG_LINES)
        self.log.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.log.setPlaceholderText("Requests to the API appear here as they finish.")
        log_box = QGroupBox("Request log")
        QVBoxLayout(log_box).addWidget(self.log)
        snippets_box = QGroupBox("Use it from your tools")
        QVBoxLayout(snippets_box).addWidget(self.snippets)

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        for box in (settings_box, urls_box, snippets_box):
            left_layout.addWidget(box)
        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(log_box)
        splitter.setSizes([580, 460])
        QVBoxLayout(self).addWidget(splitter)

        self.toggle.clicked.connect(self._on_toggle)
        self.generate_key.clicked.connect(self._generate_key)
        self.bind.activated.connect(self._on_bind_chosen)  # the user's choice only, not _load_settings
        for signal in (self.port.valueChanged, self.bind.currentIndexChanged, self.require_key.toggled,
                       self.api_key.textChanged):
            signal.connect(self._refresh_addresses)
        for signal in (self.port.valueChanged, self.bind.currentIndexChanged, self.require_key.toggled,
                       self.prefix_cache.toggled, self.kv_dtype.currentIndexChanged):
            signal.connect(self._save_settings)
        self.api_key.editingFinished.connect(self._save_key)

    # -- settings -----------------------------------------------------------------------------
    def _load_settings(self) -> None:
        self._loading = True
        try:
            self.port.setValue(self.settings.get("server.port"))
            self.bind.setCurrentIndex(self.bind.findData(self.settings.get("server.bind")))
            self.require_key.setChecked(self.settings.get("server.require_api_key"))
            self.prefix_cache.setChecked(self.settings.get("engine.prefix_cache"))
            self.kv_dtype.setCurrentIndex(self.kv_dtype.findData(self.settings.get("engine.kv_dtype")))
            self.api_key.setText(self.secrets.get(SERVER_API_KEY) or "")
        finally:
            self._loading = False
        self._refresh_addresses()

    def _on_setting_changed(self, key: str, value: object) -> None:
        """The Settings dialog changed one of this pane's settings: show it (our own saves change nothing)."""
        if key in PANE_SETTINGS and not self._loading:
            self._load_settings()

    def options(self) -> ServerOptions:
        key = self.api_key.text().strip() if self.require_key.isChecked() else ""
        return ServerOptions(port=self.port.value(), lan=self.bind.currentData() == "lan", api_key=key or None)

    def _save_settings(self) -> None:
        """The pane's choices into the settings file, as they are made (not only when Start is pressed)."""
        if self._loading:
            return
        values = {"server.port": self.port.value(), "server.bind": self.bind.currentData(),
                  "server.require_api_key": self.require_key.isChecked(),
                  "engine.prefix_cache": self.prefix_cache.isChecked(), "engine.kv_dtype": self.kv_dtype.currentData()}
        changed = {key: value for key, value in values.items() if self.settings.get(key) != value}
        if not changed:
            return
        self._loading = True  # our own change coming back through the subscription reloads nothing
        try:
            self.settings.update(changed)
            self.settings.save()
        except (SettingsError, OSError) as exc:
            self._show_error(f"The server settings were not saved: {exc}")
        finally:
            self._loading = False

    def _save_key(self) -> None:
        if self._loading or (self.secrets.get(SERVER_API_KEY) or "") == self.api_key.text().strip():
            return
        try:
            self.secrets.set(SERVER_API_KEY, self.api_key.text())
        except Exception as exc:  # a keyring backend's own failure, shown as a sentence
            self._show_error(f"The API key was not saved: {exc}")

    def _generate_key(self) -> None:
        self.api_key.setText(generate_api_key())
        self._save_key()
        self.require_key.setChecked(True)

    def _on_bind_chosen(self) -> None:
        if self.bind.currentData() != "lan" or (self.require_key.isChecked() and self.api_key.text().strip()):
            return
        answer = ask_lan_without_key(self.dialogs, self)
        if answer == GENERATE:
            self._generate_key()
        elif answer is None:  # backed out: stay on this computer only
            self.bind.setCurrentIndex(self.bind.findData("loopback"))

    # -- start / stop -------------------------------------------------------------------------
    def start(self) -> None:
        if self._switching or self.server.running:
            return
        options = self.options()
        if self.require_key.isChecked() and not options.api_key:
            self._show_error("Type or generate a key, or untick “Clients must send this key”.")
            self.toggle.setChecked(False)
            return
        self._save_settings()
        self._save_key()
        self._begin()
        self.worker.submit(lambda ctx: self.server.start(options), on_done=self._on_switched, owner=self)

    def stop(self) -> None:
        if self._switching or not self.server.running:
            return
        self._begin()
        self.worker.submit(lambda ctx: self.server.stop(), on_done=self._on_switched, owner=self)

    def _on_toggle(self, checked: bool) -> None:
        if checked:
            self.start()
        else:
            self.stop()

    def _begin(self) -> None:
        self._switching = True
        self._show_error(None)
        self.toggle.setEnabled(False)

    def _on_switched(self, result: TaskResult[ServerState]) -> None:
        self._switching = False
        if not result.ok:
            self._show_error(result.error_message)
        self._show_state(self.server.state)

    # -- what the server reports ---------------------------------------------------------------
    def _show_state(self, state: ServerState) -> None:
        running = state.running
        self.state.setText(state.message)
        self.toggle.setChecked(running)
        self.toggle.setText("Stop API" if running else "Start API")
        self.toggle.setEnabled(not self._switching and (running or self.runtime.status.ready))
        for widget in (self.port, self.bind, self.require_key, self.api_key, self.generate_key):
            widget.setEnabled(not running and not self._switching)
        self._refresh_addresses()

    def _append_log(self, entry: LogEntry) -> None:
        self.log.appendPlainText(entry.line())

    def _on_runtime(self, status: RuntimeStatus) -> None:
        self._show_state(self.server.state)

    def _refresh_addresses(self) -> None:
        state = self.server.state
        options = state.options if state.running and state.options else self.options()
        endpoints = state.endpoints if state.running and state.endpoints else endpoints_for(options, options.port)
        self.openai_url.set_text(endpoints.openai_base)
        self.anthropic_url.set_text(endpoints.anthropic_base)
        self.lan_url.set_text(endpoints.lan_root + "/v1" if endpoints.lan_root else "")
        self.urls.setRowVisible(self.lan_url, endpoints.lan_root is not None)
        exposed = options.lan and not options.api_key
        self.exposure.setText("Anyone on your network can use the model: require an API key." if exposed else "")
        self.exposure.setVisible(exposed)
        model = state.model if state.running else (self.runtime.status.model if self.runtime.status.ready else
                                                   "MODEL")
        self._show_snippets(agent_snippets(endpoints, model, options.api_key))

    def _show_snippets(self, snippets: list[Snippet]) -> None:
        for snippet in snippets:
            block = self.snippet_blocks.get(snippet.key)
            if block is None:
                block = self.snippet_blocks[snippet.key] = CopyBlock(self._copy)
                self.snippets.addTab(block, snippet.title)
            block.set_text(snippet.text)

    def _show_error(self, text: str | None) -> None:
        show_error(self.error, text)
