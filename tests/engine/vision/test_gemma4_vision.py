"""Gemma 4's vision tower on the numpy backend against transformers.

tests/fixtures/make_gemma4_vision_reference.py (run in .venv-ref; this test never imports torch)
built a tiny random-weight Gemma4VisionModel + Gemma4MultimodalEmbedder (clipped linears with bounds
that clip, standardization, GQA) and stored its soft tokens for a 6x4-patch image padded to 28 rows.
Float32 on both sides in a different summation order: within 1e-4 of the reference's scale.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.engine.backend.cpu import CpuBackend
from app.engine.loader.names import CheckpointError
from app.engine.models.vision.gemma4_config import load_gemma4_vision
from app.engine.models.vision.gemma4_vision import Gemma4VisionTower

FIXTURE = Path(__file__).parents[2] / "fixtures" / "gemma4_vision"


@pytest.fixture(scope="module")
def ref():
    with np.load(FIXTURE / "reference.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def tower():
    loaded = load_gemma4_vision(FIXTURE, json.loads((FIXTURE / "config.json").read_text()))
    assert loaded is not None
    return Gemma4VisionTower(CpuBackend(), *loaded)


def test_soft_tokens_match_transformers(tower, ref):
    out = np.asarray(tower.encode(ref["pixel_values"], ref["positions"]))
    expected = ref["embedded"]
    assert out.shape == expected.shape == (6, 48)
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(out, expected, atol=1e-4 * scale, rtol=0)


def test_padding_rows_change_nothing(tower, ref):
    real = (ref["positions"] >= 0).all(axis=-1)
    unpadded = np.asarray(tower.encode(ref["pixel_values"][real], ref["positions"][real]))
    np.testing.assert_array_equal(unpadded, np.asarray(tower.encode(ref["pixel_values"], ref["positions"])))


def test_partial_grid_is_refused(tower, ref):
    with pytest.raises(ValueError, match="not a full grid"):
        tower.encode(ref["pixel_values"][:23], ref["positions"][:23])


def test_text_only_config_has_no_tower():
    assert load_gemma4_vision(FIXTURE, {"text_config": {"hidden_size": 48}}) is None


def test_non_axial_rope_is_named():
    config = json.loads((FIXTURE / "config.json").read_text())
    config["vision_config"]["rope_parameters"] = {"rope_type": "default", "rope_theta": 100.0}
    with pytest.raises(CheckpointError, match="axial"):
        load_gemma4_vision(FIXTURE, config)
