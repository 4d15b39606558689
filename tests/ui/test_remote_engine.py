"""A remote engine: the test suite's own `paddock serve` (the API over the scripted fake engine, the MiniLM
embedding model and a scripted speech model) on another port answers the Studio's Chat, Documents and Transcribe in place of the
engine inside it; the status bar names it; the local-only panes are hidden; its errors are shown in words."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from server.fakes import FakeEngine
from studio.doc_files import write_pdf

from app.engine.server.app import create_app
from app.engine.server.launch import ServerHandle
from app.engine.server.settings import ServerSettings
from app.engine.tasks.audio import Segment, Transcript, Word
from app.studio.remote_engine import RemoteEngine, RemoteEngineError

from .drag import drop

WAIT_MS = 20_000
SPEECH = Path(__file__).parents[1] / "fixtures" / "audio" / "speech.wav"


class ScriptedWhisper:
    """The remote's speech model: two words with their times, whatever the audio."""

    model_name = "whisper-scripted"

    def transcribe(self, audio: Any, **options: Any) -> Transcript:
        words = [Word(0.0, 0.4, "Hello", 0.9), Word(0.5, 1.0, "there", 0.8)]
        return Transcript("Hello there", "en", 1.0, [Segment(0, 0.0, 1.0, " Hello there", words)])


@pytest.fixture
def remote() -> Iterator[ServerHandle]:
    """`paddock serve` on a port of its own: the fake chat model, an embedding model, a speech model."""
    def factory(engine: Any, embedder: Any, settings: ServerSettings) -> Any:
        return create_app(engine, embedder=embedder, settings=settings, transcriber=ScriptedWhisper())

    from app.engine.embeddings import load_default_embedder

    handle = ServerHandle(FakeEngine(name="cluster-model"), settings=ServerSettings(port=0),
                          embedder=load_default_embedder(), app_factory=factory)
    with handle:
        yield handle


def _window(qtbot, make_window, make_context, url: str, panes: tuple[str, ...] | None = None):
    context = make_context(threaded=True, remote_url=url)
    window = make_window(context, panes=panes)
    window.load_model()  # connects to the remote (lists its models) instead of loading one
    qtbot.waitUntil(lambda: context.host.client is context.remote, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: window.status.device.text().startswith("Device: remote"), timeout=WAIT_MS)
    return window


def test_chat_is_answered_by_the_remote_and_the_status_bar_names_it(qtbot, make_window, make_context, remote):
    window = _window(qtbot, make_window, make_context, remote.base_url)  # no /v1: it is added
    assert window.context.remote.model.name == "cluster-model"
    assert list(window.panes) == ["chat", "compare", "documents", "transcribe"]  # models, server: local only
    assert window.status.device.text() == f"Device: remote: 127.0.0.1:{remote.port}"  # which engine answers
    assert window.status.model.text() == "Model: cluster-model"
    pane = window.pane("chat")
    assert pane.model_picker is None  # the remote answers with the model it serves
    pane.input.setPlainText("hello cluster")
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as outcome:
        qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
    answer = outcome.args[0]
    assert answer.ok, answer.error_message
    assert answer.value.text == "Echo: hello cluster" and "Echo: hello cluster" in pane.transcript.toPlainText()
    stats = answer.value.stats  # the server's usage (one token per character, and the end of turn)
    assert stats.completion_tokens == len("Echo: hello cluster") + 1 and stats.prompt_tokens > len("hello cluster")
    assert stats.finish_reason == "stop"
    [conversation] = window.context.history.conversations()
    saved = window.context.history.conversation(conversation.id).messages
    assert [m.content for m in saved] == ["hello cluster", "Echo: hello cluster"] and saved[1].model == "cluster-model"


def test_documents_embed_and_answer_on_the_remote(qtbot, make_window, make_context, remote, tmp_path):
    window = _window(qtbot, make_window, make_context, remote.base_url + "/v1", panes=("documents",))
    pane = window.pane("documents")
    with qtbot.waitSignal(pane.ingest_finished, timeout=WAIT_MS) as ingested:
        drop(pane.drop_zone, [write_pdf(tmp_path / "festival.pdf")])
    assert ingested.args[0].ok, ingested.args[0].error_message
    embedder = window.context.embedders.loaded
    assert embedder.model_name == "sentence-transformers/all-MiniLM-L6-v2" and embedder.dimensions == 384
    assert type(embedder).__name__ == "RemoteEmbedder"  # the remote's model, over /v1/embeddings
    pane.question.setText("When does the festival start?")
    with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as answered:
        qtbot.mouseClick(pane.ask_button, Qt.MouseButton.LeftButton)
    answer = answered.args[0]
    assert answer.ok, answer.error_message
    assert answer.value.text.startswith("Echo: ") and "[1]" in answer.value.text  # the prompt carried excerpt [1]
    assert answer.value.citations


def test_transcribe_runs_on_the_remote(qtbot, make_window, make_context, remote):
    window = _window(qtbot, make_window, make_context, remote.base_url, panes=("transcribe",))
    pane = window.pane("transcribe")
    with qtbot.waitSignal(pane.transcription_finished, timeout=WAIT_MS) as outcome:
        drop(pane.drop_zone, [SPEECH])
    result = outcome.args[0]
    assert result.ok, result.error_message
    transcript = result.value.transcript
    assert transcript.text == "Hello there" and [w.word for w in transcript.words] == ["Hello", "there"]
    assert transcript.segments[0].words[1].start == 0.5
    assert "Hello" in pane.words.toPlainText()  # shown word by word, as a local transcription is


def test_a_remote_that_does_not_answer_is_said_in_words(qtbot, make_window, make_context):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    context = make_context(threaded=True, remote_url=closed)
    window = make_window(context, panes=("chat",))
    window.load_model()
    qtbot.waitUntil(lambda: "Remote engine: cannot reach the remote engine at" in window.status.state.text(),
                    timeout=WAIT_MS)
    assert closed.removeprefix("http://") in window.status.state.text() and context.host.client is None
    with pytest.raises(RemoteEngineError, match="not an http"):
        RemoteEngine("gpu-box:8000")



def test_an_error_from_the_remote_is_shown_in_words(qtbot, make_window, make_context):
    handle = ServerHandle(FakeEngine(name="tiny-context", context_length=24), settings=ServerSettings(port=0))
    with handle:
        window = _window(qtbot, make_window, make_context, handle.base_url, panes=("chat",))
        pane = window.pane("chat")
        pane.input.setPlainText("a question far too long for a context of twenty-four tokens")
        with qtbot.waitSignal(pane.answer_finished, timeout=WAIT_MS) as outcome:
            qtbot.mouseClick(pane.send_button, Qt.MouseButton.LeftButton)
    result = outcome.args[0]
    message = result.error_message if not result.ok else result.value.error
    assert f"the remote engine at 127.0.0.1:{handle.port} answered HTTP 400" in message
    assert "24" in message  # the server's own sentence, with the context it holds
