"""Fixtures: an engine (fake today; the real engine is one more entry in ENGINES), a real uvicorn server, SDK clients.

To run these tests against another engine, add a name to ENGINES and a branch to
`make_engine`; everything else takes the engine from the `engine` fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anthropic
import httpx
import openai
import pytest

from app.engine.server.launch import ServerHandle
from app.engine.server.settings import ServerSettings
from .fakes import FakeEmbedder, FakeEngine

ENGINES = ["fake"]


def make_engine(kind: str) -> Any:
    if kind == "fake":
        return FakeEngine()
    raise ValueError(f"unknown engine kind {kind!r}")


@pytest.fixture(scope="session", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Any:
    return make_engine(request.param)


@pytest.fixture(scope="session")
def embedder() -> FakeEmbedder:
    return FakeEmbedder()


@contextmanager
def running_server(engine: Any, embedder: Any = None, **settings: Any) -> Iterator[ServerHandle]:
    handle = ServerHandle(engine, settings=ServerSettings(port=0, **settings), embedder=embedder)
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def server(engine: Any, embedder: FakeEmbedder) -> Iterator[ServerHandle]:
    with running_server(engine, embedder) as handle:
        yield handle


@pytest.fixture
def model_name(engine: Any) -> str:
    return engine.model.name


@pytest.fixture
def openai_client(server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture
def anthropic_client(server: ServerHandle) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)


@pytest.fixture
def http(server: ServerHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client
