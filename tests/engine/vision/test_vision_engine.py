"""Images through the engine: placed over their image tokens, spliced by the runner, kept in one
prefill chunk, and keyed into the prefix cache by content.

The logits references are transformers' (tests/fixtures/make_vision_reference.py): the first
generated token's top logprobs must be the reference's last-position log-softmax."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from family_parity import check_top_logprobs

from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.core.vision import NoVisionError, place_images
from app.engine.images import ImageInput
from app.engine.sampling_params import SamplingParams

FIXTURES = Path(__file__).parents[2] / "fixtures" / "vision"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
TOP = 5


def _engine(**overrides) -> LLMEngine:
    config = dict(model=str(FIXTURES / "gemma3" / "hf"), device="cpu", max_model_len=256, block_size=4)
    return LLMEngine(EngineConfig(**{**config, **overrides}))


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return _engine()


@pytest.fixture(scope="module")
def refs():
    with np.load(FIXTURES / "references.npz") as data:
        return dict(data)


def _views(engine: LLMEngine, names: list[str]) -> list[ImageInput]:
    """Each image's whole view (the references' prompts hold one run per image)."""
    return [engine.vision.prepare((FIXTURES / "images" / f"{n}.png").read_bytes()).views[0] for n in names]


def _first_token(engine: LLMEngine, ids: list[int], images: list[ImageInput]) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=TOP)
    return engine.generate([ids], params, images=[images])[0]


def _check_against_reference(result: dict, reference_row: np.ndarray) -> None:
    check_top_logprobs(result["logprobs"][0].top, reference_row, TOP, atol=1e-4)


def test_engine_reports_vision(engine):
    assert engine.info.supports_vision
    assert engine.vision.tokens_per_image == MANIFEST["tokens_per_image"]
    assert engine.vision.image_token_id == MANIFEST["image_token_id"]


@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))
def test_first_token_logprobs_match_transformers(engine, refs, case):
    spec = MANIFEST["cases"][case]
    result = _first_token(engine, spec["token_ids"], _views(engine, spec["images"]))
    _check_against_reference(result, refs[f"logits/{case}"][-1])


def test_a_chunked_prefill_keeps_each_image_in_one_chunk(refs):
    # 16 tokens a step: the first chunk would end inside the image (positions 7..22); it stops
    # before it, and the next chunk takes the whole image, so its two-way attention is intact.
    engine = _engine(max_num_batched_tokens=16, max_num_seqs=4)
    spec = MANIFEST["cases"]["one_image"]
    chunks = []
    run = engine.runner.run
    engine.runner.run = lambda cs: chunks.extend((c.start, c.num_tokens) for c in cs) or run(cs)
    result = _first_token(engine, spec["token_ids"], _views(engine, spec["images"]))
    _check_against_reference(result, refs["logits/one_image"][-1])
    start = spec["token_ids"].index(MANIFEST["image_token_id"])
    assert chunks[:2] == [(0, start), (start, 16)]


def test_a_resent_image_is_cached_by_content_and_not_reencoded(refs):
    engine = _engine()
    spec = MANIFEST["cases"]["two_images"]
    ids = spec["token_ids"]
    images = _views(engine, spec["images"])
    first = _first_token(engine, ids, images)
    encoded = engine.runner.images.encoded
    assert first["num_cached_tokens"] == 0 and encoded == 2
    again = _first_token(engine, ids, images)
    block = engine.block_size
    assert again["num_cached_tokens"] == (len(ids) - 1) // block * block  # both images inside the hit
    assert engine.runner.images.encoded == encoded  # neither image went through the tower again
    _check_against_reference(again, refs["logits/two_images"][-1])  # the cached images' KV is right

    # the same token ids with another first image: the cache matches only up to that image
    other = _views(engine, ["nearly_square"])[0]
    swapped = _first_token(engine, ids, [other, images[1]])
    first_image_start = ids.index(MANIFEST["image_token_id"])
    assert swapped["num_cached_tokens"] <= first_image_start
    assert engine.runner.images.encoded == encoded + 1
    assert swapped["logprobs"][0].top[0] != pytest.approx(first["logprobs"][0].top[0], abs=1e-3)


def test_images_must_pair_with_runs_of_image_tokens(engine):
    spec = MANIFEST["cases"]["two_images"]
    images = _views(engine, spec["images"])
    with pytest.raises(ValueError, match="2 runs of image tokens for 1 images"):
        place_images(engine.vision, spec["token_ids"], images[:1])
    short = [
        t for i, t in enumerate(spec["token_ids"]) if i != spec["token_ids"].index(MANIFEST["image_token_id"])
    ]
    with pytest.raises(ValueError, match="not the 16 an image takes"):
        place_images(engine.vision, short, images)
    with pytest.raises(NoVisionError, match="has no vision"):
        place_images(None, spec["token_ids"], images)
    assert place_images(None, [1, 2, 3], []) == []
    assert place_images(engine.vision, spec["token_ids"], []) == []  # no images: the ids are text
