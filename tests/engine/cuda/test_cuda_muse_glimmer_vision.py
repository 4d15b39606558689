"""Muse Glimmer's vision tower on CUDA against the numpy backend (tests/fixtures/muse_glimmer_vision, tiny
random weights): the image features of both fixture images (windowed and full attention, 2D RoPE, the
resampled position table, the pixel shuffle, adapter, projection and the scale-free RMS norm)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

FIXTURE = Path(__file__).parents[2] / "fixtures" / "muse_glimmer_vision"


@pytest.mark.parametrize("name", ["image", "wide"])
def test_muse_glimmer_tower_matches_numpy(cuda, cpu, name: str) -> None:
    from app.engine.models.vision.muse_glimmer_vision import MuseGlimmerVisionTower
    from app.engine.models.vision.muse_glimmer_weights import load_muse_glimmer_vision

    loaded = load_muse_glimmer_vision(FIXTURE / "hf", json.loads((FIXTURE / "hf" / "config.json").read_text()))
    assert loaded is not None
    with np.load(FIXTURE / "reference.npz") as refs:
        pixels, grid = refs[f"{name}.pixel_values"], tuple(int(v) for v in refs[f"{name}.grid_thw"])
    ours = cuda.to_host(MuseGlimmerVisionTower(cuda, *loaded).encode(pixels, grid))
    reference = np.asarray(MuseGlimmerVisionTower(cpu, *loaded).encode(pixels, grid))
    scale = max(1.0, float(np.abs(reference).max()))
    np.testing.assert_allclose(ours, reference, rtol=0, atol=2e-3 * scale)
