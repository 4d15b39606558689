"""Fixtures shared across the suite: the embedded model loaded once per test session."""

from __future__ import annotations

import pytest


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
