"""ServerControl: the API toggle over a real uvicorn server, its addresses, snippets and request log."""

from __future__ import annotations

import importlib
import socket
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from app.engine.config import EngineConfig
from app.studio.runtime import EngineHost
from app.studio.server_control import ServerControl, ServerError, ServerOptions, agent_snippets, endpoints_for
from app.studio.tasks import SyncExecutor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the server's fake engine
fakes = importlib.import_module("server.fakes")
FakeEngine = fakes.FakeEngine


def logged(control: ServerControl, count: int) -> list:
    """The log once it holds `count` entries: a request is logged just after its last byte went out."""
    deadline = time.monotonic() + 10
    while len(control.log.entries()) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return control.log.entries()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def control():
    engine = FakeEngine()
    made = ServerControl(lambda: engine)
    yield made
    made.stop()


def test_start_serves_the_openai_sdk_logs_the_request_and_stop_closes_the_port(control):
    seen = []
    control.log.subscribe(seen.append)
    state = control.start(ServerOptions(port=free_port()))
    assert state.running and control.running and state.model == "fake-model"
    client = openai.OpenAI(base_url=state.endpoints.openai_base, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "ping"}])
    assert reply.choices[0].message.content == "Echo: ping"
    [entry] = [e for e in logged(control, 1) if e.path == "/v1/chat/completions"]
    assert (entry.method, entry.status, entry.client) == ("POST", 200, "127.0.0.1")
    assert entry in seen and "/v1/chat/completions  200" in entry.line()
    port = state.options.port
    assert not control.stop().running
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_api_key_is_required_when_set(control):
    state = control.start(ServerOptions(port=free_port(), api_key="s3cret"))
    url = state.endpoints.openai_base + "/models"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert [e.status for e in logged(control, 2)] == [401, 200]


def test_a_port_in_use_is_a_readable_error(control):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerError, match=f"Port {port} is already in use"):
            control.start(ServerOptions(port=port))
    assert not control.running


def test_without_a_model_there_is_nothing_to_serve():
    with pytest.raises(ServerError, match="No model is loaded"):
        ServerControl(lambda: None).start(ServerOptions(port=free_port()))


def test_the_server_follows_a_model_switch():
    engines: list[FakeEngine] = []

    def factory(config: EngineConfig) -> FakeEngine:
        engines.append(FakeEngine(name=config.model))
        return engines[-1]

    host = EngineHost(factory, executor=SyncExecutor())
    host.load(EngineConfig(model="first"))
    control = ServerControl(lambda: host.client)
    control.follow(host)
    states = []
    control.subscribe(states.append)
    try:
        control.start(ServerOptions(port=free_port()))
        host.load(EngineConfig(model="second"))
        assert control.running and control.state.model == "second"
        assert [s.running for s in states] == [True, False, True]
        models = httpx.get(control.state.endpoints.openai_base + "/models").json()
        names = [m["id"] for m in models["data"]]
        assert "second" in names and "first" not in names
    finally:
        control.stop()


def test_lan_listens_on_all_interfaces_and_shows_the_network_address():
    options = ServerOptions(port=1234, lan=True)
    assert options.server_settings().host == "0.0.0.0"
    endpoints = endpoints_for(options, 1234)
    assert endpoints.openai_base == "http://127.0.0.1:1234/v1" and endpoints.anthropic_base == "http://127.0.0.1:1234"
    assert endpoints.lan_root and endpoints.lan_root.endswith(":1234")
    assert endpoints_for(ServerOptions(port=1234), 1234).lan_root is None


def test_snippets_carry_the_urls_model_and_key():
    endpoints = endpoints_for(ServerOptions(port=11660), 11660)
    snippets = {s.key: s for s in agent_snippets(endpoints, "gemma", "k3y")}
    assert set(snippets) == {"continue", "claude-code", "aider", "opencode", "codex", "openai", "anthropic", "curl"}
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:11660\n" in snippets["claude-code"].text
    assert "ANTHROPIC_AUTH_TOKEN=k3y" in snippets["claude-code"].text
    assert "apiBase: http://127.0.0.1:11660/v1" in snippets["continue"].text and "apiKey: k3y" in snippets[
        "continue"].text
    assert 'base_url = "http://127.0.0.1:11660/v1"' in snippets["codex"].text
    assert 'Authorization: Bearer k3y' in snippets["curl"].text and '"model": "gemma"' in snippets["curl"].text
    keyless = {s.key: s for s in agent_snippets(endpoints, "gemma", None)}
    assert "Authorization" not in keyless["curl"].text and "apiKey" not in keyless["continue"].text


def test_embeddings_are_served_once_the_embedding_model_is_loaded():
    from app.studio.embedders import EmbedderHost

    embedder = fakes.FakeEmbedder()
    embedders = EmbedderHost(lambda: embedder)
    engine = FakeEngine()
    control = ServerControl(lambda: engine, embedder=lambda: embedders.loaded)
    control.follow_embedder(embedders)
    starts: list[str] = []
    control.subscribe(lambda s: starts.append(s.message) if s.running else None)
    try:
        state = control.start(ServerOptions(port=free_port()))
        url = state.endpoints.openai_base + "/embeddings"
        before = httpx.post(url, json={"model": "fake-embed", "input": "hello"})
        assert before.status_code == 404 and "No embedding model is loaded" in before.text
        assert "embeddings" not in state.message

        assert embedders.get() is embedder  # the Documents pane's first use loads it
        assert control.running and control.state.options == state.options  # restarted on the same port
        assert "fake-embed (embeddings)" in control.state.message
        reply = openai.OpenAI(base_url=state.endpoints.openai_base, api_key="unused", max_retries=0)
        vector = reply.embeddings.create(model="fake-embed", input="hello").data[0].embedding
        assert np.allclose(vector, embedder.embed(["hello"])[0], atol=1e-6)
        assert embedders.get() is embedder and len(starts) == 2  # loaded once: one restart, not one per use
    finally:
        control.stop()


def test_an_api_started_after_the_embedding_model_loaded_serves_it_at_once():
    from app.studio.embedders import EmbedderHost

    embedders = EmbedderHost(fakes.FakeEmbedder)
    embedders.get()
    control = ServerControl(lambda: FakeEngine(), embedder=lambda: embedders.loaded)
    try:
        state = control.start(ServerOptions(port=free_port()))
        models = httpx.get(state.endpoints.openai_base + "/models").json()
        assert "fake-embed" in [m["id"] for m in models["data"]]
    finally:
        control.stop()


def test_a_listener_that_fails_does_not_fail_the_load():
    from app.studio.embedders import EmbedderHost

    embedder = fakes.FakeEmbedder()
    embedders = EmbedderHost(lambda: embedder)
    heard = []
    embedders.subscribe(lambda e: 1 / 0)
    embedders.subscribe(heard.append)
    assert embedders.get() is embedder and heard == [embedder]  # the documents still get their model
