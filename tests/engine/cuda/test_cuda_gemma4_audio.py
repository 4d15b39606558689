"""Gemma 4's audio tower on CUDA against the numpy backend (tests/fixtures/gemma4_audio, tiny random
weights): the soft tokens of the spoken clip and of its first 0.3 s. (The fixture's text model has
16-wide heads, below what the CUDA attention kernels take: the tower alone is compared.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).parents[2] / "fixtures" / "gemma4_audio"
HF = FIXTURES / "hf"


@pytest.mark.parametrize("clip", ["speech", "short"])
def test_tower_soft_tokens_match_numpy(cuda, cpu, clip) -> None:
    from app.engine.models.audio import load_gemma4_audio_tower

    config = json.loads((HF / "config.json").read_text())
    with np.load(FIXTURES / "references.npz") as refs:
        mel = refs[f"mel/{clip}"][refs[f"mask/{clip}"].astype(bool)]
    ours = cuda.to_host(load_gemma4_audio_tower(HF, config, cuda).encode(mel))
    reference = np.asarray(load_gemma4_audio_tower(HF, config, cpu).encode(mel))
    scale = max(1.0, float(np.abs(reference).max()))
    np.testing.assert_allclose(ours, reference, rtol=0, atol=2e-3 * scale)
