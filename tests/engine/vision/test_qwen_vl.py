"""Qwen2.5-VL on the numpy backend against Hugging Face transformers.

tests/fixtures/make_qwen_vl_reference.py (run in .venv-ref; this test never imports torch) built a
tiny random-weight Qwen2_5_VLForConditionalGeneration (window attention with a full-attention
layer, 2x2 merge, M-RoPE split 2/3/3) and stored Qwen2VLImageProcessorPil's pixel values and
grids, the vision tower's outputs, get_rope_index's 3D positions, the float32 logits (eager
attention) of prompts with one and with two images and of the same prompts as text only, and
greedy continuations.

Tolerances: pixel values are the same float32 arithmetic on the same PIL resize, so they must be
equal to 1e-6. Tower and logits are float32 computations in a different summation order: within
1e-4 of the reference's scale (the merger's GELU uses an erf good to 1.5e-7).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from family_parity import check_top_logprobs, close_to_scale
from PIL import Image, ImageOps

from app.engine.backend.cpu import CpuBackend
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.core.vision import place_images
from app.engine.images import ImageInput, PromptImage
from app.engine.layers.rope import cos_sin_table, inverse_frequencies, mrope_cos_sin
from app.engine.loader.names import CheckpointError
from app.engine.loader.weights import open_checkpoint
from app.engine.models.mrope import mrope_positions
from app.engine.models.qwen2_vl import config_from_hf
from app.engine.models.vision import QwenVisionModel, load_vision
from app.engine.models.vision.image_processing import ImageError
from app.engine.models.vision.qwen_vl import window_order
from app.engine.models.vision.qwen_vl_processing import preprocess_qwen, smart_resize
from app.engine.models.vision.splice import image_spans
from app.engine.sampling_params import SamplingParams

FIXTURES = Path(__file__).parents[2] / "fixtures" / "vision" / "qwen2_5_vl"
HF = FIXTURES / "hf"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
IMAGES = sorted(MANIFEST["grids"])
IMAGE_TOKEN = MANIFEST["image_token_id"]
TOP = 5


@pytest.fixture(scope="module")
def refs():
    with np.load(FIXTURES / "references.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def vision() -> QwenVisionModel:
    model = load_vision(open_checkpoint(HF), CpuBackend())
    assert isinstance(model, QwenVisionModel)
    return model


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(HF), device="cpu", max_model_len=256, block_size=4))


# -- preprocessing ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", IMAGES)
def test_pixel_values_and_grid_match_the_hf_processor(vision, refs, name):
    patches, grid = preprocess_qwen(Image.open(FIXTURES / "images" / f"{name}.png"), vision.config)
    assert list(grid) == MANIFEST["grids"][name]
    np.testing.assert_allclose(patches, refs[f"pixels/{name}"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("size", sorted(MANIFEST["resize_grids"]))
def test_smart_resize_grids_match_the_hf_processor(vision, size):
    width, height = (int(v) for v in size.split("x"))
    cfg = vision.config
    h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    assert [1, h // cfg.patch_size, w // cfg.patch_size] == MANIFEST["resize_grids"][size]
    assert h % cfg.factor == 0 and w % cfg.factor == 0


def test_an_image_too_elongated_is_refused(vision):
    with pytest.raises(ImageError, match="aspect ratio is over 200"):
        smart_resize(2, 500, 28, vision.config.min_pixels, vision.config.max_pixels)


# -- the vision tower ------------------------------------------------------------------------


@pytest.mark.parametrize("name", IMAGES)
def test_vision_tower_matches_transformers(vision, refs, name):
    grid = tuple(MANIFEST["grids"][name])
    hidden, merged = vision.tower(refs[f"pixels/{name}"], grid)
    close_to_scale(merged, refs[f"features/{name}"])
    # transformers returns the blocks' output in its window order; ours is in the patches' order
    windows, _ = window_order(grid, vision.config.merge_size, vision.config.window_merged)
    unit = vision.config.merge_unit
    close_to_scale(hidden[(windows[:, None] * unit + np.arange(unit)).reshape(-1)], refs[f"tower/{name}"])


def test_window_order_covers_every_merged_patch_once(vision):
    # 5x3 merged patches in windows of 2: 3x2 windows, the last row and column padded
    order, lengths = window_order((1, 10, 6), 2, 2)
    assert sorted(order.tolist()) == list(range(15))
    assert lengths == [4, 2, 4, 2, 2, 1]
    assert order[:4].tolist() == [0, 1, 3, 4]


# -- M-RoPE ----------------------------------------------------------------------------------


def _placed(case: str) -> list[PromptImage]:
    spec = MANIFEST["cases"][case]
    spans = image_spans(spec["token_ids"], IMAGE_TOKEN)
    grids = [tuple(MANIFEST["grids"][n]) for n in spec["images"]]
    blank = np.zeros((1, 1), np.float32)
    return [PromptImage(s, e, ImageInput(blank, grid_thw=g)) for (s, e), g in zip(spans, grids, strict=True)]


@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))
def test_mrope_positions_match_get_rope_index(refs, case):
    n = len(MANIFEST["cases"][case]["token_ids"])
    images = _placed(case)
    whole = mrope_positions(images, 0, n, merge=2)
    np.testing.assert_array_equal(whole, refs[f"positions/{case}"])
    chunked = np.concatenate(
        [mrope_positions(images, s, min(3, n - s), merge=2) for s in range(0, n, 3)], axis=1
    )
    np.testing.assert_array_equal(chunked, whole)
    # decode steps past the prompt continue one by one from the last position
    after = mrope_positions(images, n, 2, merge=2)
    np.testing.assert_array_equal(after, np.repeat(whole.max() + np.arange(1, 3)[None], 3, axis=0))


def test_mrope_with_equal_position_ids_is_plain_rope():
    cos, sin = cos_sin_table(inverse_frequencies(16, 10_000.0), 64)
    positions = np.array([0, 5, 17, 63], np.int32)
    got = mrope_cos_sin(cos, sin, np.stack([positions] * 3), (2, 3, 3))
    np.testing.assert_array_equal(got[0], cos[positions])
    np.testing.assert_array_equal(got[1], sin[positions])
    # unequal ids: frequencies 0-1 follow t, 2-4 h, 5-7 w
    mixed = mrope_cos_sin(cos, sin, np.array([[1], [2], [3]]), (2, 3, 3))[0][0]
    np.testing.assert_array_equal(mixed, np.concatenate([cos[1, :2], cos[2, 2:5], cos[3, 5:]]))


def test_mrope_section_is_read_from_both_config_layouts():
    v5 = json.loads((HF / "config.json").read_text())
    assert config_from_hf(v5).mrope_section == (2, 3, 3)
    flat = {**v5.pop("text_config"), **v5, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
    flat.pop("rope_parameters")
    assert config_from_hf(flat).mrope_section == (2, 3, 3)
    with pytest.raises(CheckpointError, match="sums to 7"):
        config_from_hf({**flat, "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 3]}})


# -- the engine ------------------------------------------------------------------------------


def _views(engine: LLMEngine, names: list[str]) -> list[ImageInput]:
    return [engine.vision.prepare((FIXTURES / "images" / f"{n}.png").read_bytes()).views[0] for n in names]


def _check_top(result: dict, reference_row: np.ndarray) -> None:
    check_top_logprobs(result["logprobs"][0].top, reference_row, TOP, atol=1e-4)


@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))
def test_greedy_tokens_and_logprobs_match_transformers(engine, refs, case):
    spec = MANIFEST["cases"][case]
    params = SamplingParams(temperature=0.0, max_tokens=len(MANIFEST["greedy"][case]), logprobs=TOP)
    result = engine.generate([spec["token_ids"]], params, images=[_views(engine, spec["images"])])[0]
    _check_top(result, refs[f"logits/{case}"][-1])
    assert result["token_ids"] == MANIFEST["greedy"][case]


@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))
def test_text_only_prompts_match_transformers(engine, refs, case):
    ids = MANIFEST["cases"][case]["text_token_ids"]
    result = engine.generate([ids], SamplingParams(temperature=0.0, max_tokens=1, logprobs=TOP))[0]
    _check_top(result, refs[f"logits_text/{case}"][-1])


def test_a_chunked_prefill_may_cut_an_image_and_still_match(refs):
    # 8 tokens a step: the 12-token image of the two-image prompt is split across steps (its
    # tokens attend causally, so nothing keeps it whole), each chunk with its own M-RoPE rows
    engine = LLMEngine(EngineConfig(model=str(HF), device="cpu", max_model_len=256, block_size=4,
                                    max_num_batched_tokens=8, max_num_seqs=4))  # fmt: skip
    spec = MANIFEST["cases"]["two_images"]
    chunks = []
    run = engine.runner.run
    engine.runner.run = lambda cs: chunks.extend((c.start, c.num_tokens) for c in cs) or run(cs)
    params = SamplingParams(temperature=0.0, max_tokens=3, logprobs=TOP)
    result = engine.generate([spec["token_ids"]], params, images=[_views(engine, spec["images"])])[0]
    _check_top(result, refs["logits/two_images"][-1])
    assert result["token_ids"] == MANIFEST["greedy"]["two_images"][:3]
    large = image_spans(spec["token_ids"], IMAGE_TOKEN)[1]
    assert any(large[0] < start < large[1] for start, _ in chunks)


def test_a_resent_image_is_cached_by_content_and_another_one_is_not(refs):
    engine = LLMEngine(EngineConfig(model=str(HF), device="cpu", max_model_len=256, block_size=4))
    spec = MANIFEST["cases"]["one_image"]
    ids, images = spec["token_ids"], _views(engine, spec["images"])
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=TOP)
    first = engine.generate([ids], params, images=[images])[0]
    encoded = engine.runner.images.encoded
    again = engine.generate([ids], params, images=[images])[0]
    assert again["num_cached_tokens"] == (len(ids) - 1) // 4 * 4  # the image inside the hit
    assert engine.runner.images.encoded == encoded  # not through the tower again
    _check_top(again, refs["logits/one_image"][-1])  # the cached image's KV (and positions) are right

    buffer = io.BytesIO()
    ImageOps.mirror(Image.open(FIXTURES / "images" / "odd_rgba.png")).save(buffer, "PNG")
    mirrored = engine.vision.prepare(buffer.getvalue()).views  # the same size: the same grid and tokens
    other = engine.generate([ids], params, images=[list(mirrored)])[0]
    assert other["num_cached_tokens"] <= ids.index(IMAGE_TOKEN)
    assert engine.runner.images.encoded == encoded + 1
    assert other["logprobs"][0].top != first["logprobs"][0].top


def test_the_prompter_expands_the_placeholder_to_the_merged_patch_count(engine):
    data = (FIXTURES / "images" / "large.png").read_bytes()
    prepared = engine.vision.prepare(data)
    text = engine.vision.expand(f"<|im_start|>user\n{engine.vision.placeholder}hi", [prepared])
    ids = engine.tokenizer.encode(text, add_special_tokens=False, parse_special=True)
    spans = image_spans(ids, IMAGE_TOKEN)
    t, h, w = MANIFEST["grids"]["large"]
    assert [e - s for s, e in spans] == [t * h * w // 4]
    assert ids[spans[0][0] - 1] == engine.tokenizer.token_to_id("<|vision_start|>")
    assert len(place_images(engine.vision, ids, engine.vision.views([prepared]))) == 1
    short = ids[: spans[0][0]] + ids[spans[0][0] + 1 :]
    with pytest.raises(ValueError, match="are 11, not the 12 an image takes"):
        place_images(engine.vision, short, engine.vision.views([prepared]))


def test_a_png_round_trip_through_prepare_matches_preprocessing(engine, refs):
    buffer = io.BytesIO()
    Image.open(FIXTURES / "images" / "odd_rgba.png").save(buffer, "PNG")
    view = engine.vision.prepare(buffer.getvalue()).views[0]
    np.testing.assert_allclose(view.pixel_values, refs["pixels/odd_rgba"], rtol=0, atol=1e-6)
    assert view.grid_thw == tuple(MANIFEST["grids"]["odd_rgba"])
