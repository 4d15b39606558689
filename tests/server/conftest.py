"""Fixtures: an engine, a real uvicorn server on a loopback port over it, and the official SDK clients.

Every test takes its engine from the `engine` fixture: the scripted fake and the real embedded model
by default (PADDOCK_SERVER_TEST_ENGINES=fake runs only the fake).
Assertions on exact text rely on the fake's scripted answers (fakes.py).
"""

from __future__ import annotations

import os
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
from .helpers import CLIENT_TIMEOUT

# Which engines the server tests run against: "fake" (scripted, instant) and/or "embedded"
# (the real engine over the embedded Gemma 3 270M, from the suite's `embedded_engine` fixture).
ENGINES = os.environ.get("PADDOCK_SERVER_TEST_ENGINES", "fake,embedded").split(",")


# Module scope: an `embedded` wrapper is closed after each module, so the suite's shared
# LLMEngine is never driven by two threads at once (see tests/conftest.py).
@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "fake":
        yield FakeEngine()
    elif request.param == "embedded":
        from app.engine.core.async_engine import AsyncEngine

        client = AsyncEngine(engine=request.getfixturevalue("embedded_engine"))
        yield client
        client.close()
    else:
        raise ValueError(f"unknown engine kind {request.param!r} (fake, embedded)")


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`slow_on_embedded` makes a test's embedded-engine run slow: the fake's run checks the same server
    behaviour in milliseconds, and each request on the real model costs about a CPU-second."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("engine") == "embedded" and item.get_closest_marker(
            "slow_on_embedded"
        ):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def scripted(engine: Any) -> None:
    """For tests that assert the fake's scripted answers exactly: skipped on a real engine."""
    if not isinstance(engine, FakeEngine):
        pytest.skip("asserts the scripted fake engine's exact answers")


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


@pytest.fixture(scope="module")
def server(engine: Any, embedder: FakeEmbedder) -> Iterator[ServerHandle]:
    with running_server(engine, embedder) as handle:
        yield handle


@pytest.fixture
def model_name(engine: Any) -> str:
    return engine.model.name


@pytest.fixture
def openai_client(server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT)


@pytest.fixture
def anthropic_client(server: ServerHandle) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT)


@pytest.fixture
def http(server: ServerHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=CLIENT_TIMEOUT) as client:
        yield client
