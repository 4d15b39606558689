"""The pane registry: what the main window shows, in order, and how each pane gets its services.

A pane is any QWidget. To add one, write `app/ui/panes/<name>.py` and append a
`PaneSpec` to `PANES` whose `build` picks from the `StudioContext` exactly what the pane
needs (panes are handed their services; they never look them up). Imports are inside
the builders so a pane's module loads only when the window is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtWidgets import QWidget

from app.ui.context import StudioContext


@dataclass(frozen=True)
class PaneSpec:
    key: str  # stable id: window state, tests, screenshots
    title: str  # the navigation entry
    build: Callable[[StudioContext], QWidget]
    tooltip: str = ""


def _chat(ctx: StudioContext) -> QWidget:
    from app.studio.doc_qa import DocumentSet
    from app.ui.panes.chat import ChatPane
    from app.ui.widgets.model_picker import ModelPicker

    # a remote engine answers with the model it serves: no local models to pick
    picker = None if ctx.remote else ModelPicker(ctx.library, ctx.host, ctx.settings, ctx.runtime, ctx.worker,
                                                 ctx.dialogs)
    # documents dropped on the chat: the embedding model loads at the first drop, shared with the API
    documents = DocumentSet(ctx.embedders.get, keep_scanned=True, ocr=ctx.ocr)
    return ChatPane(ctx.chat, ctx.history, ctx.runtime, ctx.worker, ctx.dialogs, ctx.chat_defaults,
                    lambda: ctx.settings.get("chat.system_prompt"), documents, copy_text=ctx.copy_text,
                    enter_sends=lambda: ctx.settings.get("chat.enter_sends"), model_picker=picker)


def _compare(ctx: StudioContext) -> QWidget:
    from app.ui.panes.compare import ComparePane

    # the local column compares the engine inside the Studio; a remote one is added as an OpenAI column
    return ComparePane(lambda: None if ctx.remote else ctx.host.client, ctx.secrets, ctx.settings, ctx.worker, ctx.dialogs,
                       state_file=ctx.paths.data_dir / "compare.json", runtime=ctx.runtime, copy_text=ctx.copy_text)


def _models(ctx: StudioContext) -> QWidget:
    from app.ui.panes.models import ModelsPane

    return ModelsPane(ctx.library, ctx.hub, ctx.host, ctx.runtime, ctx.settings, ctx.worker, ctx.dialogs)


def _server(ctx: StudioContext) -> QWidget:
    from app.ui.panes.server import ServerPane

    return ServerPane(ctx.server, ctx.runtime, ctx.settings, ctx.secrets, ctx.worker, ctx.copy_text,
                      dialogs=ctx.dialogs)


def _documents(ctx: StudioContext) -> QWidget:
    from app.studio.doc_qa import DocQASession, DocumentSet
    from app.ui.panes.documents import DocumentsPane

    # kept, with embeddings, across restarts; scanned PDFs' pages are read by the OCR model if one is set,
    # else they stay in the set for a vision model to read
    documents = DocumentSet(ctx.embedders.get, store=ctx.paths.data_dir / "documents", keep_scanned=True,
                            ocr=ctx.ocr)
    return DocumentsPane(DocQASession(documents, lambda: ctx.host.client), ctx.runtime, ctx.worker)


def _transcribe(ctx: StudioContext) -> QWidget:
    from app.studio.transcription import TranscriptionService
    from app.ui.panes.transcribe import TranscribePane

    remote = ctx.remote
    if remote:
        service = TranscriptionService(transcriber_factory=lambda path, device: remote.transcriber())
        return TranscribePane(service, ctx.worker, ctx.dialogs)
    service = TranscriptionService(ctx.settings.get("transcribe.model") or None)
    return TranscribePane(service, ctx.worker, ctx.dialogs, settings=ctx.settings)


PANES: list[PaneSpec] = [
    PaneSpec("chat", "Chat", _chat, "Talk to the loaded model"),
    PaneSpec("compare", "Compare", _compare, "One prompt, several models side by side"),
    PaneSpec("models", "Models", _models, "Your models folder, the Hugging Face hub, will-it-fit"),
    PaneSpec("server", "Server", _server, "The local OpenAI/Anthropic-compatible API"),
    PaneSpec("documents", "Documents", _documents, "Ask questions about PDF, Word, Excel and text files"),
    PaneSpec("transcribe", "Transcribe", _transcribe, "Speech to text with word timestamps, on this computer"),
]

