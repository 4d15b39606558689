"""Muse Glimmer's vision tower, adapter and projection on the numpy backend against transformers, and images
through the engine from its Hugging Face folder.

tests/fixtures/make_muse_glimmer_vision_reference.py (run in .venv-ref; this test never imports torch) built
a tiny random-weight MuseGlimmerForConditionalGeneration (4 tower layers: 3 windowed over 4x4-patch windows,
1 full) and stored, for a 37x23 image scaled up to a 6x10 patch grid and a 130x41 one scaled down under the
24-token cap to 6x16, the processor's patches, the tower's merged output and the image features, plus one
prompt's greedy continuation with the first image. Float32 on both sides in another summation order: within
1e-4 of the reference's scale.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from family_parity import check_top_logprobs, close_to_scale

from app.engine.backend.cpu import CpuBackend
from app.engine.loader.names import CheckpointError
from app.engine.models.vision.muse_glimmer_vision import MuseGlimmerVisionTower
from app.engine.models.vision.muse_glimmer_weights import load_muse_glimmer_vision

FIXTURE = Path(__file__).parents[2] / "fixtures" / "muse_glimmer_vision"
HF = FIXTURE / "hf"
ENGINE = json.loads((FIXTURE / "engine.json").read_text())
IMAGES = ["image", "wide"]


@pytest.fixture(scope="module")
def ref():
    with np.load(FIXTURE / "reference.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def tower():
    loaded = load_muse_glimmer_vision(HF, json.loads((HF / "config.json").read_text()))
    assert loaded is not None
    return MuseGlimmerVisionTower(CpuBackend(), *loaded)


def _close(out, expected) -> None:
    assert out.shape == expected.shape
    close_to_scale(out, expected)


@pytest.mark.parametrize("name", IMAGES)
def test_tower_and_features_match_transformers(tower, ref, name):
    pixels, grid = ref[f"{name}.pixel_values"], tuple(int(v) for v in ref[f"{name}.grid_thw"])
    _close(np.asarray(tower.tower(pixels, grid)), ref[f"{name}.tower"])
    features = np.asarray(tower.encode(pixels, grid))
    _close(features, ref[f"{name}.features"])
    assert features.shape == (grid[1] * grid[2] // 4, 64) == (ENGINE["image_tokens"][name], 64)


def test_a_grid_the_patches_do_not_fill_is_refused(tower, ref):
    with pytest.raises(ValueError, match="do not fit the grid"):
        tower.encode(ref["image.pixel_values"][:-4], (1, 6, 10))
    with pytest.raises(ValueError, match="do not fit the grid"):
        tower.encode(ref["image.pixel_values"], (1, 5, 12))  # 60 patches, but not whole 2x2 cells


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}, "rope_type"),
        ({"pos_emb_width": 8}, "only square ones"),
        ({"hidden_act": "silu"}, "hidden_act"),
        ({"merge_size": 4}, "merge_size"),
    ],
)
def test_unsupported_vision_configs_are_named(change, named):
    config = json.loads((HF / "config.json").read_text())
    config["vision_config"].update(change)
    with pytest.raises(CheckpointError, match=named):
        load_muse_glimmer_vision(HF, config)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda t: t.pop("model.vision_tower.layers.2.attn.k_proj.weight"),
         r"lacks model\.vision_tower\.layers\.2\.attn\.k_proj\.weight"),
        (lambda t: t.update({"model.vision_adapter.fc2.weight": np.zeros((48, 40), np.float32)}),
         r"tensor model\.vision_adapter\.fc2\.weight has shape \(48, 40\), expected \(48, 48\)"),
    ],
)  # fmt: skip
def test_a_folder_with_a_tower_tensor_missing_or_misshapen_is_named(tmp_path, edit, named):
    from safetensors.numpy import load_file, save_file

    for file in HF.iterdir():
        shutil.copy(file, tmp_path / file.name)
    tensors = load_file(HF / "model.safetensors")
    edit(tensors)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"{tmp_path.name}: .*{named}"):
        load_muse_glimmer_vision(tmp_path, json.loads((HF / "config.json").read_text()))


def test_text_only_config_has_no_tower():
    assert load_muse_glimmer_vision(HF, {"text_config": {"hidden_size": 64}}) is None


@pytest.fixture(scope="module")
def engine():
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(HF), device="cpu", max_model_len=256, block_size=4))


@pytest.mark.parametrize("name", IMAGES)
def test_patches_equal_the_hf_processor(engine, ref, name):
    (view,) = engine.vision.prepare((FIXTURE / f"{name}.png").read_bytes()).views
    np.testing.assert_allclose(view.pixel_values, ref[f"{name}.pixel_values"], atol=1e-6, rtol=0)
    assert view.grid_thw == tuple(ref[f"{name}.grid_thw"])
    assert engine.vision.tokens_for(view) == ENGINE["image_tokens"][name]


def test_an_image_expands_to_its_start_patches_and_end(engine):
    prepared = engine.vision.prepare((FIXTURE / "image.png").read_bytes())
    text = engine.vision.expand("Look: <|patch|>\nSo", [prepared])
    ids = engine.tokenizer.encode(text, add_special_tokens=False, parse_special=True)
    assert ids == ENGINE["token_ids"][1:]  # the prompt's ids after its BOS


def test_greedy_answer_to_an_image_equals_transformers(engine, ref):
    from app.engine.sampling_params import SamplingParams

    view = engine.vision.prepare((FIXTURE / "image.png").read_bytes()).views[0]
    params = SamplingParams(temperature=0.0, max_tokens=len(ENGINE["greedy"]), logprobs=5)
    result = engine.generate([ENGINE["token_ids"]], params, images=[[view]])[0]
    assert result["token_ids"] == ENGINE["greedy"]
    check_top_logprobs(result["logprobs"][0].top, ref["image.logits"], 5, atol=1e-3)


def test_two_images_of_two_sizes_answer_as_transformers(engine):
    from app.engine.sampling_params import SamplingParams

    views = [engine.vision.prepare((FIXTURE / f"{n}.png").read_bytes()).views[0] for n in IMAGES]
    spec = ENGINE["two_images"]
    params = SamplingParams(temperature=0.0, max_tokens=len(spec["greedy"]))
    result = engine.generate([spec["token_ids"]], params, images=[views])[0]
    assert result["token_ids"] == spec["greedy"]


def test_an_image_run_of_the_wrong_length_is_refused(engine):
    from app.engine.core.vision import place_images

    view = engine.vision.prepare((FIXTURE / "image.png").read_bytes()).views[0]
    short = list(ENGINE["token_ids"])
    short.remove(258)
    with pytest.raises(ValueError, match="not the 15 an image takes"):
        place_images(engine.vision, short, [view])


@pytest.mark.parametrize("data", [b"not an image", b"\x89PNG\r\n\x1a\n" + b"\0" * 40])
def test_corrupt_images_get_an_error_naming_them(engine, data):
    from app.engine.models.vision.image_processing import ImageError

    with pytest.raises(ImageError, match="image could not be decoded"):
        engine.vision.prepare(data)


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(out, "PNG")
    return out.getvalue()


def test_images_too_large_or_too_thin_for_the_token_cap_are_refused(engine):
    from app.engine.models.vision.image_processing import ImageError
    from app.engine.models.vision.muse_glimmer_processing import MuseGlimmerImagePrompter, smart_resize

    small = MuseGlimmerImagePrompter(engine.vision.config, engine.tokenizer, max_pixels=100)
    with pytest.raises(ImageError, match="image is 37x23 pixels; at most 100"):
        small.prepare((FIXTURE / "image.png").read_bytes())
    # no grid of whole cells fits 24 tokens: transformers' fallback would make one row of 268 cells
    assert smart_resize(1, 3000, 8, 24) == (8, 268 * 8)
    with pytest.raises(ImageError, match="image is 3000x1 pixels: its aspect ratio is too extreme for 24 image tokens"):
        engine.vision.prepare(_png(3000, 1))
    (view,) = engine.vision.prepare(_png(190, 4)).views  # thin, but a 1 x 24 grid of cells fits
    assert view.grid_thw == (1, 2, 48) and engine.vision.tokens_for(view) == 24


def test_document_pages_render_at_the_largest_square_the_token_cap_takes(engine):
    from types import SimpleNamespace

    from app.studio.documents import PageScale
    from app.studio.page_qa import page_scale

    # sqrt(24) -> 4 cells of 8 px a side: pages rendered with their long edge at 32 px
    assert page_scale(SimpleNamespace(vision=engine.vision)) == PageScale(32, "long")
    (view,) = engine.vision.prepare(_png(32, 32)).views  # 4 x 4 cells of 8 px: 16 of the 24 tokens
    assert view.grid_thw == (1, 8, 8)
