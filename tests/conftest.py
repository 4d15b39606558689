"""Fixtures shared across the suite (the embedded model loaded once per test session), and each test's
times recorded where `PADDOCK_TEST_TIMES` names a folder (`make test` does; .ci/tier_budget.py reads them)."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

TIMES_DIR = os.environ.get("PADDOCK_TEST_TIMES")


def _cpu_seconds() -> float:
    """This process's CPU time, all its threads, plus that of its finished child processes."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _record(row: dict) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(TIMES_DIR) / f"{worker}-{os.getpid()}.jsonl", "a") as out:  # type: ignore[arg-type]
        out.write(json.dumps(row) + "\n")


def pytest_collection_finish(session: pytest.Session) -> None:
    """The process's start, imports and collection: every pytest process pays it, whatever it then runs."""
    if TIMES_DIR and session.items:
        Path(TIMES_DIR).mkdir(parents=True, exist_ok=True)
        _record({"test": "<start and collection>", "slow": False, "cpu": _cpu_seconds(), "wall": None})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Setup, call and teardown of one test: module and session fixtures count with the test that
    builds or ends them."""
    if not TIMES_DIR:
        yield
        return
    wall, cpu = time.perf_counter(), _cpu_seconds()
    yield
    slow = item.get_closest_marker("slow") is not None
    _record({"test": item.nodeid, "slow": slow, "cpu": _cpu_seconds() - cpu, "wall": time.perf_counter() - wall})


@pytest.fixture(scope="session")
def embedded_engine():
    """The embedded Gemma 3 270M on the numpy backend, loaded once for the whole session.

    Tests that drive it directly must leave no request running; tests that need the
    threaded `AsyncEngine` wrap it with `AsyncEngine(engine=...)` and close that wrapper
    before returning, so the engine is owned by one thread at a time.
    """
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sample.grammar import tokenizer_view

    engine = LLMEngine(EngineConfig(model="default", device="cpu", max_model_len=4096, max_num_seqs=16))
    # llguidance's vocabulary view builds on its own thread from the engine's construction, holding the
    # interpreter lock for seconds: waited for here, so no test that watches responsiveness overlaps it
    tokenizer_view(engine.tokenizer, engine.model_config.vocab_size).result()
    return engine
