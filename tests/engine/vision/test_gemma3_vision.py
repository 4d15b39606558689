"""Gemma 3's vision side on the numpy backend against Hugging Face transformers.

tests/fixtures/make_vision_reference.py (run in .venv-ref; this test never imports torch)
built a tiny random-weight Gemma3ForConditionalGeneration and stored transformers' pixel values
(Gemma3ImageProcessorPil, pan-and-scan on), vision tower outputs, projector outputs and the
final float32 logits (eager attention) of prompts with one and with two images.

Tolerances: pixel values are the same float32 arithmetic on the same PIL resize, so they must
be equal to 1e-6. Tower and logits are float32 computations in a different summation order:
within 1e-4 of the reference's scale. The mmproj GGUF stores the projection in F16, as
llama.cpp's converter does: its soft tokens are within 1e-3 * scale of the float32 ones.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.engine.backend.cpu import CpuBackend
from app.engine.core.scheduler import ScheduledChunk
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import build_model
from app.engine.models.vision import load_vision
from app.engine.models.vision.image_processing import preprocess
from app.engine.models.vision.splice import image_spans
from app.engine.models.vision.weights import find_mmproj
from app.engine.request import Request
from app.engine.sampling_params import SamplingParams
from app.engine.worker.runner import ModelRunner

FIXTURES = Path(__file__).parents[2] / "fixtures" / "vision"
HF = FIXTURES / "gemma3" / "hf"
MMPROJ = FIXTURES / "gemma3" / "mmproj-gemma3.gguf"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
IMAGES = sorted(MANIFEST["num_crops"])


@pytest.fixture(scope="module")
def refs():
    with np.load(FIXTURES / "references.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def backend():
    return CpuBackend()


@pytest.fixture(scope="module")
def checkpoint():
    return open_checkpoint(HF)


@pytest.fixture(scope="module")
def vision(checkpoint, backend):
    return load_vision(checkpoint, backend)


def _image(name: str) -> Image.Image:
    return Image.open(FIXTURES / "images" / f"{name}.png")


def _close(ours: np.ndarray, ref: np.ndarray, rel: float) -> None:
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(ours, ref, rtol=0, atol=rel * scale)


@pytest.mark.parametrize("name", IMAGES)
def test_pixel_values_equal_the_hf_processor(vision, refs, name):
    processed = preprocess(_image(name), vision.config)
    assert processed.num_crops == MANIFEST["num_crops"][name]
    assert processed.pixel_values.shape == refs[f"pixels/{name}"].shape
    np.testing.assert_allclose(processed.pixel_values, refs[f"pixels/{name}"], rtol=0, atol=1e-6)


def test_fixture_exercises_crops_and_their_refusals():
    crops = MANIFEST["num_crops"]
    assert crops["wide"] == 4 and crops["tall"] == 3  # crops along either side
    assert crops["nearly_square"] == 0 and crops["short_tall"] == 0  # under the ratio / crops too small


@pytest.mark.parametrize("name", IMAGES)
def test_tower_and_projector_match_transformers(vision, refs, name):
    pixels = refs[f"pixels/{name}"][0]
    tower = vision.encoder(pixels)
    _close(tower, refs[f"tower/{name}"], 1e-4)
    features = vision.encode(pixels)
    assert features.shape == (MANIFEST["tokens_per_image"], 64)
    _close(features, refs[f"features/{name}"], 1e-4)


def test_mmproj_gguf_gives_the_same_soft_tokens(checkpoint, backend, refs):
    mm = load_vision(checkpoint, backend, mmproj=MMPROJ)
    hf = load_vision(checkpoint, backend).config
    # the clip.* keys give the whole config; pan-and-scan is a processor setting mmproj files lack
    assert mm.config.pan_and_scan is None
    assert mm.config.layer_norm_eps == pytest.approx(hf.layer_norm_eps, rel=1e-6)  # GGUF stores float32
    assert (
        dataclasses.replace(mm.config, pan_and_scan=hf.pan_and_scan, layer_norm_eps=hf.layer_norm_eps) == hf
    )
    for name in ("odd_rgba", "wide"):
        _close(mm.encode(refs[f"pixels/{name}"][0]), refs[f"features/{name}"], 1e-3)


def test_mmproj_is_found_beside_a_text_gguf(tmp_path):
    (tmp_path / "model-Q4_K_M.gguf").write_bytes(b"")
    assert find_mmproj(tmp_path / "model-Q4_K_M.gguf") is None
    (tmp_path / "mmproj-model-f16.gguf").write_bytes(b"")
    assert find_mmproj(tmp_path / "model-Q4_K_M.gguf") == tmp_path / "mmproj-model-f16.gguf"


def _logits(model, backend, vision, token_ids, images, spans_on=True):
    """Logits at every position of one prefill of `token_ids` with the images' soft tokens spliced in."""
    cfg = model.config
    block = 4
    n_blocks = -(-len(token_ids) // block) + 1
    caches = [
        backend.alloc_kv_cache(n_blocks, block, cfg.num_kv_heads, cfg.head_dim) for _ in range(cfg.num_layers)
    ]
    runner = ModelRunner(model, backend, caches, block)
    request = Request("r", list(token_ids), SamplingParams(temperature=0.0))
    request.block_ids = list(range(1, n_blocks))
    ids, meta, _ = runner.prepare([ScheduledChunk(request, 0, len(token_ids), True)])
    spans = image_spans(token_ids, MANIFEST["image_token_id"])
    assert len(spans) == len(images)
    rows = np.concatenate([np.arange(s, e) for s, e in spans])
    values = np.concatenate(
        [vision.encode(preprocess(_image(n), vision.config).pixel_values[0]) for n in images]
    )
    if spans_on:
        meta.image_spans = [spans]
    hidden = model.forward(ids, meta, runner.kv_caches, embeds=(rows, values))
    return model.logits(hidden)


@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))
def test_final_logits_match_transformers(checkpoint, backend, vision, refs, case):
    spec = MANIFEST["cases"][case]
    model = build_model(checkpoint, backend, max_positions=128)
    logits = _logits(model, backend, vision, spec["token_ids"], spec["images"])
    ref = refs[f"logits/{case}"]
    _close(logits, ref, 1e-4)
    assert (logits.argmax(-1) == ref.argmax(-1)).all()
    # the images matter, and so does their two-way attention: without either the logits move far
    scale = float(np.abs(ref).max())
    assert np.abs(ref - refs[f"logits_text/{case}"]).max() > 0.05 * scale
    causal = _logits(model, backend, vision, spec["token_ids"], spec["images"], spans_on=False)
    assert np.abs(causal - ref).max() > 0.01 * scale
