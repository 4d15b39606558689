"""What the views are given: the Studio's services, built once by main.py and passed down explicitly.

Panes never look anything up for themselves (no `QApplication.instance()`, no globals);
the pane registry picks what each pane needs from this record and hands it over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.studio.chat import ChatService, ChatSettings
from app.studio.downloads import HubClient
from app.studio.embedders import EmbedderHost
from app.studio.history import History
from app.studio.library import ModelLibrary
from app.studio.ocr import OcrHost
from app.studio.paths import StudioPaths
from app.studio.remote_engine import RemoteEngine
from app.studio.runtime import EngineHost, RuntimeStatus
from app.studio.secrets import HF_TOKEN, SecretStore
from app.studio.server_control import ServerControl
from app.studio.settings import Settings
from app.ui.widgets.dialogs import Dialogs
from app.ui.workers import Worker


class RuntimeWatcher(QObject):
    """The engine host's status as a Qt signal on the Qt thread (the host reports on its own thread)."""

    status_changed = Signal(object)  # RuntimeStatus

    def __init__(self, host: EngineHost, worker: Worker, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._host = host
        self._unsubscribe = host.subscribe(worker.threadsafe(self.status_changed.emit, owner=self))

    @property
    def status(self) -> RuntimeStatus:
        """The host's status now (the signal may still be on its way)."""
        return self._host.status

    def close(self) -> None:
        self._unsubscribe()


@dataclass
class StudioContext:
    paths: StudioPaths
    settings: Settings
    secrets: SecretStore
    history: History
    host: EngineHost
    chat: ChatService
    server: ServerControl
    worker: Worker
    runtime: RuntimeWatcher
    dialogs: Dialogs
    copy_text: Callable[[str], None]  # the clipboard, injected so tests can read what was copied
    embedders: EmbedderHost  # the embedding model the Documents pane loads, served by the local API too
    remote: RemoteEngine | None = None  # an OpenAI-compatible server answering in place of the local engine
    remote_problem: str | None = None  # why the remote engine asked for cannot be used (a bad URL)
    ocr: OcrHost = field(default_factory=OcrHost)  # the OCR model reading scanned PDF pages (Documents)

    @property
    def models_dir(self) -> Path:
        return Path(self.settings.get("models.folder") or self.paths.models_dir)

    def library(self) -> ModelLibrary:
        return ModelLibrary(self.models_dir, self.paths.other_models)

    def hub(self) -> HubClient:
        """A hub client with the current endpoint setting and token (both may change while running)."""
        return HubClient(endpoint=self.settings.get("hub.endpoint") or None, token=self.secrets.get(HF_TOKEN))

    def chat_defaults(self) -> ChatSettings:
        """New conversations start from the Chat settings."""
        return ChatSettings(temperature=self.settings.get("chat.temperature"), top_p=self.settings.get("chat.top_p"),
                            max_tokens=self.settings.get("chat.max_tokens"))
