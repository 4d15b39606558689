"""PaddleOCR-VL's tower and projector on CUDA against the numpy backend (tests/fixtures/vision/paddleocr_vl,
tiny random weights): both synthesised pages, whose grids differ (10x6 and 4x18 patches), so the
resized position table, the 2D rotary rows and the 2x2 merge are all exercised at two shapes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

FOLDER = Path(__file__).parents[2] / "fixtures" / "vision" / "paddleocr_vl"


def test_paddle_tower_and_projector_match_numpy(cuda, cpu) -> None:
    from app.engine.loader.weights import open_checkpoint
    from app.engine.models.vision import load_vision

    manifest = json.loads((FOLDER / "manifest.json").read_text())
    checkpoint = open_checkpoint(FOLDER / "hf")
    ours, reference = load_vision(checkpoint, cuda), load_vision(checkpoint, cpu)
    with np.load(FOLDER / "references.npz") as refs:
        for name, grid in manifest["grids"].items():
            pixels, grid = refs[f"pixels/{name}"], tuple(grid)
            patches = pixels.reshape(len(pixels), -1)
            got_hidden, want_hidden = ours.tower(patches, grid), reference.tower(patches, grid)
            got = (got_hidden, ours.project(got_hidden, grid))
            want = (want_hidden, reference.project(want_hidden, grid))
            for g, w in zip(got, want, strict=True):
                w = np.asarray(w)
                scale = max(1.0, float(np.abs(w).max()))
                np.testing.assert_allclose(cuda.to_host(g), w, rtol=0, atol=2e-3 * scale, err_msg=name)
