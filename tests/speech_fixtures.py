"""What the speech LLM tests share: a family's stored references and the spoken clip, cut as its
manifest says (tests/fixtures/make_*_reference.py wrote both)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from app.engine.tasks.audio import decode_audio

FIXTURES = Path(__file__).parent / "fixtures"
CLIP = FIXTURES / "audio" / "speech.wav"


def references(family: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / family / "references.npz") as data:
        return dict(data)


def clip_samples(manifest: dict[str, Any]) -> dict[str, np.ndarray]:
    """The clip's mono 16 kHz samples under each case name, cut to the manifest's sample count."""
    clip = decode_audio(CLIP)
    return {name: clip[:count] for name, count in manifest["samples"].items()}
