"""Gemma 4 with images from the GGUF pair llama.cpp publishes (a `gemma4` text GGUF + a `gemma4v` mmproj),
written here at test time from the tiny Hugging Face fixtures (tests/engine/gemma4_mmproj_gguf.py: gguf-py's
writer, the converter's names and layout), against transformers' outputs for the same weights
(tests/fixtures/make_gemma4_vision_reference.py): the GGUF path is held to transformers, not to the HF path.

A GGUF does not say whether image tokens attend both ways; llama.cpp's rule stands in (all but the E-series,
the models with per-layer inputs), which is what the two fixtures' configs say: `bidirectional` two-way,
`ple` causal. The standalone tower fixture (clipped linears with bounds that clip, GQA, standardization)
checks the bounds' and the patch kernel's layout against its own reference. Float32 files, float32
arithmetic in another order: within 1e-4 of the scale, as the HF path's tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from family_parity import check_top_logprobs, close_to_scale
from gemma4_mmproj_gguf import IMAGE_TOKENS, write_mmproj, write_pair

from app.engine.backend.cpu import CpuBackend
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.loader.names import CheckpointError
from app.engine.models.vision.gemma4_mmproj import load_gemma4_mmproj
from app.engine.models.vision.gemma4_vision import Gemma4VisionTower
from app.engine.sampling_params import SamplingParams

FIXTURE = Path(__file__).parents[1] / "fixtures" / "gemma4_vision"
VARIANTS = ("bidirectional", "ple")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma4-gguf")
    return {v: write_pair(FIXTURE / v / "hf", root / v) for v in VARIANTS}


def reference(variant: str) -> tuple[dict, dict[str, np.ndarray]]:
    with np.load(FIXTURE / variant / "engine.npz") as data:
        return json.loads((FIXTURE / variant / "engine.json").read_text()), dict(data)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gguf_pair_answers_an_image_as_transformers(pairs, variant):
    engine = LLMEngine(EngineConfig(model=str(pairs[variant]), device="cpu", max_model_len=256, block_size=4))
    expected, arrays = reference(variant)
    assert engine.runner.images.two_way == (variant == "bidirectional")
    view = engine.vision.prepare((FIXTURE / "image.png").read_bytes()).views[0]
    assert engine.vision.tokens_for(view) == expected["soft_tokens"]
    soft = np.asarray(engine.runner.images.vision.encode_image(view))
    want = arrays["image_features"]
    close_to_scale(soft, want)
    params = SamplingParams(temperature=0.0, max_tokens=len(expected["greedy"]), logprobs=5)
    result = engine.generate([expected["token_ids"]], params, images=[[view]])[0]
    assert result["token_ids"] == expected["greedy"]
    check_top_logprobs(result["logprobs"][0].top, arrays["logits"], 5, atol=1e-3)


@pytest.fixture(scope="module")
def tower_mmproj(tmp_path_factory) -> Path:
    """The standalone tower fixture's mmproj (its folder: config.json + model.safetensors)."""
    path = tmp_path_factory.mktemp("gemma4-tower") / "mmproj-tower.gguf"
    write_mmproj(FIXTURE, path)
    return path


def test_clipped_tower_from_an_mmproj_equals_transformers(tower_mmproj):
    cfg, tensors = load_gemma4_mmproj(tower_mmproj, 48, two_way_images=True)
    assert cfg.clipped_linears and cfg.standardize and (cfg.num_heads, cfg.num_kv_heads) == (2, 1)
    with np.load(FIXTURE / "reference.npz") as ref:
        out = np.asarray(
            Gemma4VisionTower(CpuBackend(), cfg, tensors).encode(ref["pixel_values"], ref["positions"])
        )
        expected = ref["embedded"]
    close_to_scale(out, expected)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"drop": ("v.blk.1.ffn_up.weight",)}, r"tensor 'v.blk.1.ffn_up.weight' is missing"),
        ({"drop": ("v.patch_embd.weight",)}, r"tensor 'v.patch_embd.weight' is missing"),
        (
            {"reshape": {"v.blk.0.attn_k.weight": (32, 32)}},
            r"tensor 'v.blk.0.attn_k.weight' has shape \(32, 32\), expected \(16, 32\)",
        ),
        (
            {"reshape": {"mm.input_projection.weight": (40, 32)}},
            r"tensor 'mm.input_projection.weight' has shape \(40, 32\), expected \(48, 32\)",
        ),
    ],
)
def test_missing_or_misshapen_tensors_are_named_with_the_file(tmp_path, change, named):
    path = tmp_path / "mmproj-broken.gguf"
    write_mmproj(FIXTURE, path, **change)
    with pytest.raises(CheckpointError, match=rf"{path.name}: {named}"):
        load_gemma4_mmproj(path, 48, two_way_images=True)


def test_a_truncated_mmproj_is_named(tmp_path, tower_mmproj):
    path = tmp_path / "mmproj-cut.gguf"
    path.write_bytes(tower_mmproj.read_bytes()[:-4096])
    with pytest.raises(
        CheckpointError, match=rf"{path.name}: file is truncated: tensor '(v|mm)\.[^']+' ends at byte"
    ):
        load_gemma4_mmproj(path, 48, two_way_images=True)


def test_a_wrong_projector_or_width_is_refused(tmp_path, tower_mmproj):
    with pytest.raises(CheckpointError, match="projection_dim is 48, the text model's hidden size 64"):
        load_gemma4_mmproj(tower_mmproj, 64, two_way_images=True)
    gemma3 = FIXTURE.parent / "vision" / "gemma3" / "mmproj-gemma3.gguf"
    with pytest.raises(CheckpointError, match=r"'gemma3' is Gemma 3's SigLIP vision tower.*Gemma 4's"):
        load_gemma4_mmproj(gemma3, 48, two_way_images=True)


def test_the_image_tokens_are_in_the_text_gguf(pairs):
    from app.engine.loader.gguf import read_gguf

    tokens = read_gguf(pairs["ple"]).metadata["tokenizer.ggml.tokens"]
    assert {i: tokens[i] for i in IMAGE_TOKENS} == IMAGE_TOKENS


def test_will_it_fit_sizes_the_tower_at_its_soft_token_budget(pairs):
    """Both files are sized as the engine runs them: 70 soft tokens of 2x2 patches (the mmproj's
    image_max_pixels, the folder's max_soft_tokens), not the converter's placeholder image size 224."""
    from app.engine.plan.fit import shape_from_checkpoint

    for vision in (
        shape_from_checkpoint(pairs["ple"]).vision,
        shape_from_checkpoint(FIXTURE / "ple" / "hf").vision,
    ):
        assert vision is not None and vision.patches == 70 * 2 * 2
        assert (vision.hidden_size, vision.num_heads, vision.intermediate_size) == (32, 2, 64)
        assert vision.activation_bytes() == (280**2 + 280 * (6 * 32 + 2 * 64)) * 4
    assert shape_from_checkpoint(pairs["ple"]).vision.source == "mmproj-tiny-gemma4-f32.gguf"


def test_a_gemma4_gguf_alone_takes_no_images_and_one_given_by_path_does(pairs, tmp_path):
    import shutil

    alone = tmp_path / "tiny-gemma4-f32.gguf"
    shutil.copy(pairs["bidirectional"], alone)
    assert LLMEngine(EngineConfig(model=str(alone), device="cpu", max_model_len=256)).vision is None
    mmproj = pairs["bidirectional"].parent / "mmproj-tiny-gemma4-f32.gguf"
    given = LLMEngine(EngineConfig(model=str(alone), device="cpu", max_model_len=256, mmproj=str(mmproj)))
    assert given.vision is not None and given.runner.images.two_way
