"""What the server says as it starts: a --max-ctx above what the model takes is a warning, not a silent cap."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "qwen3" / "qwen3-kquants.gguf"


def test_max_ctx_above_the_models_context_warns_and_names_the_context(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="app.engine.core.engine"):
        engine = LLMEngine(
            EngineConfig(model=str(TINY), device="cpu", max_model_len=1_000_000, max_num_seqs=2)
        )
    context = engine.model_config.context_length
    assert engine.max_model_len == context
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"--max-ctx 1000000 exceeds the model's context: the context is {context} tokens"]


def test_max_ctx_within_the_context_says_nothing(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="app.engine.core.engine"):
        engine = LLMEngine(EngineConfig(model=str(TINY), device="cpu", max_model_len=256, max_num_seqs=2))
    assert engine.max_model_len == 256
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
