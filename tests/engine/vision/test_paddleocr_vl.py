"""PaddleOCR-VL on the numpy backend against Hugging Face transformers.

tests/fixtures/make_paddleocr_vl_reference.py (run in .venv-ref; this test never imports torch) built a
tiny random-weight PaddleOCRVLForConditionalGeneration (a 4x4 learned position grid resized to each
page, 2D rotary positions, 2x2 merge in the projector, ERNIE text side with M-RoPE split 2/3/3) in the
published folder layout, two synthesised pages of text of different sizes, and stored
PaddleOCRVLImageProcessorPil's pixel values and grids, the tower's and projector's outputs,
get_rope_index's 3D positions, the last position's float32 logits and greedy tokens of an OCR prompt.

Tolerances: pixel values are the same float32 arithmetic on the same PIL resize (1e-6); the tower,
projector and logits are float32 in another summation order (1e-4 of the reference's scale).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from family_parity import check_top_logprobs, close_to_scale
from PIL import Image

from app.engine.backend.cpu import CpuBackend
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.images import ImageInput, PromptImage
from app.engine.loader.names import CheckpointError
from app.engine.loader.weights import open_checkpoint
from app.engine.models.mrope import mrope_positions
from app.engine.models.paddleocr import config_from_hf
from app.engine.models.vision import PaddleVisionTower, load_vision
from app.engine.models.vision.paddleocr_processing import paddle_resize, preprocess_paddle
from app.engine.models.vision.paddleocr_vision import resized_positions
from app.engine.models.vision.splice import image_spans
from app.engine.sampling_params import SamplingParams

FIXTURES = Path(__file__).parents[2] / "fixtures" / "vision" / "paddleocr_vl"
HF = FIXTURES / "hf"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
PAGES = sorted(MANIFEST["grids"])
IMAGE_TOKEN = MANIFEST["image_token_id"]


@pytest.fixture(scope="module")
def refs():
    with np.load(FIXTURES / "references.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def vision() -> PaddleVisionTower:
    model = load_vision(open_checkpoint(HF), CpuBackend())
    assert isinstance(model, PaddleVisionTower)
    return model


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(HF), device="cpu", max_model_len=256, block_size=4))


def _patches(refs, name: str) -> np.ndarray:
    pixels = refs[f"pixels/{name}"]
    return pixels.reshape(len(pixels), -1)


# -- preprocessing ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", PAGES)
def test_pixel_values_and_grid_match_the_hf_processor(vision, refs, name):
    patches, grid = preprocess_paddle(Image.open(FIXTURES / "images" / f"{name}.png"), vision.config)
    assert list(grid) == MANIFEST["grids"][name]
    np.testing.assert_allclose(patches, _patches(refs, name), rtol=0, atol=1e-6)


@pytest.mark.parametrize("size", sorted(MANIFEST["resize_grids"]))
def test_resize_grids_match_the_hf_processor(vision, size):
    # thin strips (13x500, 200x3) take PaddleOCR-VL's own first step: the short side raised to 28 px
    width, height = (int(v) for v in size.split("x"))
    cfg = vision.config
    h, w = paddle_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    assert [1, h // cfg.patch_size, w // cfg.patch_size] == MANIFEST["resize_grids"][size]


# -- the tower and projector -----------------------------------------------------------------


@pytest.mark.parametrize("name", PAGES)
def test_tower_and_projector_match_transformers(vision, refs, name):
    grid = tuple(MANIFEST["grids"][name])
    hidden = vision.tower(_patches(refs, name), grid)
    close_to_scale(hidden, refs[f"tower/{name}"])
    close_to_scale(vision.project(hidden, grid), refs[f"features/{name}"])


def test_the_position_grid_resized_to_its_own_size_is_itself(vision):
    table = vision.position_table
    grid = vision.config.position_grid
    np.testing.assert_allclose(resized_positions(table, grid, grid, grid), table, rtol=0, atol=1e-6)
    # one row: every column of it a blend of the table's two middle rows
    row = resized_positions(table, grid, 1, grid)
    middle = table.reshape(grid, grid, -1)[grid // 2 - 1 : grid // 2 + 1].mean(axis=0)
    np.testing.assert_allclose(row, middle, rtol=0, atol=1e-6)


def test_patches_that_do_not_fit_the_grid_are_refused(vision, refs):
    with pytest.raises(ValueError, match="do not fit the grid"):
        vision.tower(_patches(refs, "wide"), (1, 8, 10))  # 80 patches, not its 72


# -- the text side ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", PAGES)
def test_mrope_positions_match_get_rope_index(refs, name):
    ids = MANIFEST["prompts"][name]
    ((start, end),) = image_spans(ids, IMAGE_TOKEN)
    image = PromptImage(
        start, end, ImageInput(np.zeros((1, 1), np.float32), grid_thw=tuple(MANIFEST["grids"][name]))
    )
    np.testing.assert_array_equal(mrope_positions([image], 0, len(ids), merge=2), refs[f"positions/{name}"])


def test_the_text_config_reads_the_published_flat_layout_too():
    v5 = json.loads((HF / "config.json").read_text())
    assert config_from_hf(v5).mrope_section == (2, 3, 3)
    flat = {**v5.pop("text_config"), **v5, "rope_theta": 500000.0,
            "rope_scaling": {"type": "default", "rope_type": "default", "mrope_section": [2, 3, 3]}}  # fmt: skip
    flat.pop("rope_parameters")
    cfg = config_from_hf(flat)
    assert (cfg.mrope_section, cfg.rope_theta, cfg.rope_scaling, cfg.qkv_bias) == (
        (2, 3, 3),
        500000.0,
        None,
        False,
    )
    with pytest.raises(CheckpointError, match="use_bias is true"):
        config_from_hf({**flat, "use_bias": True})


# -- the engine ------------------------------------------------------------------------------


def _view(engine: LLMEngine, name: str) -> ImageInput:
    (view,) = engine.vision.prepare((FIXTURES / "images" / f"{name}.png").read_bytes()).views
    return view


@pytest.mark.parametrize("name", PAGES)
def test_greedy_tokens_match_transformers(engine, refs, name):
    ids = MANIFEST["prompts"][name]
    params = SamplingParams(temperature=0.0, max_tokens=len(MANIFEST["greedy"][name]), logprobs=5)
    result = engine.generate([ids], params, images=[[_view(engine, name)]])[0]
    assert result["token_ids"] == MANIFEST["greedy"][name]
    check_top_logprobs(result["logprobs"][0].top, refs[f"logits/{name}"], 5, atol=1e-4)


def test_the_chat_template_and_prompter_make_the_reference_prompt(engine):
    # the folder's template over the placeholder and "OCR:", the placeholder expanded per merged patch
    prepared = engine.vision.prepare((FIXTURES / "images" / "portrait.png").read_bytes())
    messages = [{"role": "user", "content": f"{engine.vision.placeholder}OCR:"}]
    text = engine.vision.expand(engine.chat_template.render(messages, add_generation_prompt=True), [prepared])
    ids = engine.tokenizer.encode(text, add_special_tokens=False, parse_special=True)
    assert ids == MANIFEST["prompts"]["portrait"]
