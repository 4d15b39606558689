"""The Server pane over the fake engine: the toggle, addresses and snippets with copy buttons, the request log."""

from __future__ import annotations

import socket

import httpx
import numpy as np
import openai
import pytest
from PySide6.QtCore import QPoint, Qt
from server.fakes import FakeEngine

from app.ui.widgets.lan_guard import GENERATE

WAIT_MS = 15_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def pane(make_window):
    window = make_window(panes=("server",), threaded=True)
    return window.pane("server")


def _toggle(qtbot, pane, running: bool) -> None:
    qtbot.mouseClick(pane.toggle, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: pane.server.running == running and pane.toggle.isEnabled(), timeout=WAIT_MS)


def test_toggle_serves_requests_logs_them_and_stops(qtbot, pane):
    port = free_port()
    pane.port.setValue(port)
    _toggle(qtbot, pane, True)
    assert pane.toggle.text() == "Stop API" and f"127.0.0.1:{port}" in pane.state.text()
    assert not pane.port.isEnabled()  # settings are fixed while serving
    base = pane.openai_url.text.text()
    assert base == f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "Echo: hi"
    qtbot.waitUntil(lambda: "POST /v1/chat/completions  200" in pane.log.toPlainText(), timeout=WAIT_MS)

    _toggle(qtbot, pane, False)
    assert pane.toggle.text() == "Start API" and pane.state.text() == "The API is off."
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/models")
    assert pane.settings.get("server.port") == port  # the choice is kept for next time


def test_addresses_and_snippets_copy_to_the_clipboard(qtbot, pane, copied):
    pane.port.setValue(11777)
    qtbot.mouseClick(pane.openai_url.copy_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(pane.anthropic_url.copy_button, Qt.MouseButton.LeftButton)
    assert copied == ["http://127.0.0.1:11777/v1", "http://127.0.0.1:11777"]
    titles = [pane.snippets.tabText(i) for i in range(pane.snippets.count())]
    assert titles[:3] == ["Continue (config.yaml)", "Claude Code", "Codex CLI (~/.codex/config.toml)"]
    claude = pane.snippet_blocks["claude-code"]
    qtbot.mouseClick(claude.copy_button, Qt.MouseButton.LeftButton)
    assert "export ANTHROPIC_BASE_URL=http://127.0.0.1:11777\n" in copied[-1]
    assert "ANTHROPIC_MODEL=fake-model" in copied[-1]  # the loaded model's name


def test_an_api_key_and_the_lan_warning(qtbot, pane):
    pane.bind.setCurrentIndex(pane.bind.findData("lan"))
    assert "Anyone on your network" in pane.exposure.text() and pane.lan_url.text.text().endswith("/v1")
    qtbot.mouseClick(pane.generate_key, Qt.MouseButton.LeftButton)
    key = pane.api_key.text()
    assert key.startswith("pk-") and pane.require_key.isChecked() and not pane.exposure.isVisibleTo(pane)
    assert f"Authorization: Bearer {key}" in pane.snippet_blocks["curl"].text.toPlainText()
    pane.bind.setCurrentIndex(pane.bind.findData("loopback"))
    pane.port.setValue(free_port())
    _toggle(qtbot, pane, True)
    url = pane.openai_url.text.text() + "/models"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert pane.secrets.get("server_api_key") == key
    _toggle(qtbot, pane, False)


def test_a_port_in_use_is_explained(qtbot, pane):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        pane.port.setValue(taken.getsockname()[1])
        qtbot.mouseClick(pane.toggle, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: pane.error.isVisibleTo(pane), timeout=WAIT_MS)
    assert "already in use by another program" in pane.error.text()
    assert not pane.toggle.isChecked() and pane.toggle.isEnabled()


def test_kv_cache_settings_are_saved_for_the_next_model_load(qtbot, pane):
    from app.studio.runtime import engine_config

    assert pane.prefix_cache.isChecked() and pane.kv_dtype.currentData() == "auto"  # the defaults
    pane.prefix_cache.setChecked(False)
    pane.kv_dtype.setCurrentIndex(pane.kv_dtype.findData("fp8"))
    pane.port.setValue(free_port())
    _toggle(qtbot, pane, True)  # starting saves the pane's settings
    _toggle(qtbot, pane, False)
    assert pane.settings.get("engine.prefix_cache") is False and pane.settings.get("engine.kv_dtype") == "fp8"
    config = engine_config(pane.settings)
    assert config.enable_prefix_caching is False and config.kv_dtype_name == "fp8"


def _tick(qtbot, box) -> None:
    """Click a check box on its box (a wide QCheckBox's centre can be past its text, where clicks miss)."""
    qtbot.mouseClick(box, Qt.MouseButton.LeftButton, pos=QPoint(8, box.height() // 2))


def _restarted_pane(make_window, make_context):
    """The Server pane of a new window over the same home folder: what a restart shows (shown, to be clicked)."""
    window = make_window(make_context(FakeEngine()), panes=("server",))
    window.show()
    return window.pane("server")


def test_choices_are_saved_as_made_and_come_back_after_a_restart(qtbot, pane, make_window, make_context):
    pane.window().show()
    pane.dialogs.choice = GENERATE  # "Local network" asks about a key: generate one
    pane.bind.setFocus()
    qtbot.keyClick(pane.bind, Qt.Key.Key_Down)  # This computer only -> Local network, as the user picks it
    assert pane.bind.currentData() == "lan" and pane.require_key.isChecked()
    key = pane.api_key.text()
    _tick(qtbot, pane.prefix_cache)  # off
    pane.port.setValue(12345)
    # nothing was started: each choice is in the file already
    again = _restarted_pane(make_window, make_context)
    assert again.bind.currentData() == "lan" and again.require_key.isChecked() and again.api_key.text() == key
    assert again.port.value() == 12345 and not again.prefix_cache.isChecked()

    # the case: back to this computer only, key no longer required, restart
    again.bind.setFocus()
    qtbot.keyClick(again.bind, Qt.Key.Key_Up)
    _tick(qtbot, again.require_key)
    third = _restarted_pane(make_window, make_context)
    assert third.bind.currentData() == "loopback" and not third.require_key.isChecked()
    assert not third.exposure.isVisibleTo(third)


def test_a_typed_key_is_saved_when_the_field_is_left(qtbot, pane, make_window, make_context):
    pane.window().show()
    _tick(qtbot, pane.require_key)
    pane.api_key.setFocus()
    qtbot.keyClicks(pane.api_key, "my-own-key")
    qtbot.keyClick(pane.api_key, Qt.Key.Key_Return)  # editing finished
    again = _restarted_pane(make_window, make_context)
    assert again.api_key.text() == "my-own-key" and again.require_key.isChecked()


def test_the_settings_dialog_changes_show_in_the_pane(qtbot, pane):
    pane.settings.update({"server.port": 23456, "engine.kv_dtype": "fp8"})
    assert pane.port.value() == 23456 and pane.kv_dtype.currentData() == "fp8"


def test_the_api_serves_embeddings_once_the_documents_pane_loaded_the_model(qtbot, make_window, tmp_path):
    from studio.doc_files import write_pdf

    from .drag import drop

    window = make_window(panes=("server", "documents"), threaded=True)
    pane, documents = window.pane("server"), window.pane("documents")
    pane.port.setValue(free_port())
    _toggle(qtbot, pane, True)
    url = pane.openai_url.text.text() + "/embeddings"
    before = httpx.post(url, json={"model": "sentence-transformers/all-MiniLM-L6-v2", "input": "hello"})
    assert before.status_code == 404 and "No embedding model is loaded" in before.text

    with qtbot.waitSignal(documents.ingest_finished, timeout=60_000):
        drop(documents.drop_zone, [write_pdf(tmp_path / "festival.pdf")])  # loads the embedding model
    qtbot.waitUntil(lambda: pane.server.running and "(embeddings)" in pane.state.text(), timeout=WAIT_MS)
    client = openai.OpenAI(base_url=pane.openai_url.text.text(), api_key="unused", max_retries=0)
    reply = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input="hello")
    embedder = window.context.embedders.loaded
    assert len(reply.data[0].embedding) == embedder.dimensions == 384
    assert np.allclose(reply.data[0].embedding, embedder.embed(["hello"])[0], atol=1e-5)
    _toggle(qtbot, pane, False)
