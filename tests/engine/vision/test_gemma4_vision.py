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
from family_parity import check_top_logprobs

from app.engine.backend.cpu import CpuBackend
from app.engine.loader.names import CheckpointError
from app.engine.models.vision.gemma4_config import load_gemma4_vision
from app.engine.models.vision.gemma4_processing import grid_positions
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


ENGINE = json.loads((FIXTURE / "engine.json").read_text())


@pytest.fixture(scope="module")
def engine():
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(FIXTURE / "hf"), device="cpu", max_model_len=256, block_size=4))


@pytest.mark.parametrize(("name", "key"), [("image", ""), ("wide", "wide_")])
def test_patches_equal_the_hf_processor(engine, name, key):
    prepared = engine.vision.prepare((FIXTURE / f"{name}.png").read_bytes())
    (view,) = prepared.views
    with np.load(FIXTURE / "engine.npz") as data:
        np.testing.assert_allclose(view.pixel_values, data[f"{key}pixel_values"], atol=1e-6, rtol=0)
        np.testing.assert_array_equal(grid_positions(view.grid_thw), data[f"{key}positions"])
        assert engine.vision.tokens_for(view) == len(data[f"{key}positions"]) // 4
    if name == "image":
        assert engine.vision.tokens_for(view) == ENGINE["soft_tokens"]


def test_greedy_answer_to_an_image_equals_transformers(engine):
    from app.engine.sampling_params import SamplingParams

    view = engine.vision.prepare((FIXTURE / "image.png").read_bytes()).views[0]
    params = SamplingParams(temperature=0.0, max_tokens=len(ENGINE["greedy"]), logprobs=5)
    result = engine.generate([ENGINE["token_ids"]], params, images=[[view]])[0]
    assert result["token_ids"] == ENGINE["greedy"]
    with np.load(FIXTURE / "engine.npz") as data:
        check_top_logprobs(result["logprobs"][0].top, data["logits"], 5, atol=1e-3)


def test_an_image_of_the_wrong_size_is_refused_by_its_runs(engine):
    from app.engine.core.vision import place_images

    view = engine.vision.prepare((FIXTURE / "image.png").read_bytes()).views[0]
    short = [t for i, t in enumerate(ENGINE["token_ids"]) if not (t == 258 and i % 7 == 0)]
    with pytest.raises(ValueError, match="not the 66 an image takes"):
        place_images(engine.vision, short, [view])


@pytest.mark.parametrize("data", [b"not an image", b"\x89PNG\r\n\x1a\n" + b"\0" * 40])
def test_corrupt_images_get_an_error_naming_them(engine, data):
    from app.engine.models.vision.image_processing import ImageError

    with pytest.raises(ImageError, match="image could not be decoded"):
        engine.vision.prepare(data)


def test_too_large_images_are_refused_and_thin_ones_capped(engine):
    from app.engine.models.vision.gemma4_processing import Gemma4ImagePrompter, target_size
    from app.engine.models.vision.image_processing import ImageError

    small = Gemma4ImagePrompter(engine.vision.config, engine.tokenizer, max_pixels=100)
    with pytest.raises(ImageError, match="image is 33x19 pixels; at most 100"):
        small.prepare((FIXTURE / "image.png").read_bytes())
    # one row of 2x2 cells, as long as the 70-token budget allows (transformers' edge case)
    assert target_size(1, 5000, engine.vision.config) == (8, 560)
