"""The tiny random Gemma 3 vision model (tests/fixtures/vision/gemma3/hf) in an AsyncEngine on the CPU
that records every request it is handed (`engine.sent`): what Studio tests check reached the model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

GEMMA3_VISION = Path(__file__).parent / "fixtures" / "vision" / "gemma3" / "hf"


@contextmanager
def recording_vision_engine(max_model_len: int = 1024) -> Iterator[Any]:
    from app.engine import AsyncEngine, EngineConfig

    engine = AsyncEngine(EngineConfig(model=str(GEMMA3_VISION), device="cpu", max_model_len=max_model_len,
                                      block_size=4))  # fmt: skip
    sent: list[Any] = []
    generate = engine.generate
    engine.generate = lambda request: sent.append(request) or generate(request)
    engine.sent = sent
    try:
        yield engine
    finally:
        engine.close()
