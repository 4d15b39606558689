"""Gemma 4's two image paths that differ from the plain causal one, through the whole engine against
transformers 5.24 (tests/fixtures/make_gemma4_vision_reference.py; this test never imports torch):

- `bidirectional`: `use_bidirectional_attention: "vision"`, as the larger Gemma 4 models: on sliding layers
  an image's soft tokens see each other both ways, the window cutting only what lies behind
  (transformers' AND(sliding window, OR(causal, same image))); global layers stay causal. The window (8)
  is far under the image's 66 tokens, so the window's interaction counts;
- `ple`: the E-series' per-layer inputs, whose image positions take the pad token's per-layer embedding
  plus the projection of the image's soft token (not the image token's own), with the last two layers
  reading the first two's KV.

One image's greedy tokens equal transformers', the first step's top-5 log-probs within 1e-3, and the
soft tokens (tower and embedder) within 1e-4 of the scale of transformers' `get_image_features`. Each runs
on the numpy reference and the numba CPU kernels (which hand a step with images to the reference
attention). A model that ignored the difference is caught: the same weights run as if causal everywhere,
or with the image token's own per-layer inputs, move the first step's log-probs by more than 1e-2.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from family_parity import check_top_logprobs, close_to_scale, log_softmax

from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.sampling_params import SamplingParams

FIXTURE = Path(__file__).parents[2] / "fixtures" / "gemma4_vision"
VARIANTS = ("bidirectional", "ple")


def reference(variant: str) -> tuple[dict, dict[str, np.ndarray]]:
    with np.load(FIXTURE / variant / "engine.npz") as data:
        return json.loads((FIXTURE / variant / "engine.json").read_text()), dict(data)


_ENGINES: dict[tuple[str, str], LLMEngine] = {}


def engine_for(variant: str, kernels: str = "numpy") -> LLMEngine:
    if (variant, kernels) not in _ENGINES:
        config = EngineConfig(
            model=str(FIXTURE / variant / "hf"),
            device="cpu",
            cpu_kernels=kernels,
            max_model_len=256,
            block_size=4,
            enable_prefix_caching=False,  # the checks that change the model run the same prompt again
        )
        _ENGINES[variant, kernels] = LLMEngine(config)
    return _ENGINES[variant, kernels]


def first_step(engine: LLMEngine, expected: dict) -> dict:
    view = engine.vision.prepare((FIXTURE / "image.png").read_bytes()).views[0]
    params = SamplingParams(temperature=0.0, max_tokens=len(expected["greedy"]), logprobs=5)
    return engine.generate([expected["token_ids"]], params, images=[[view]])[0]


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_answer_to_an_image_equals_transformers(variant, kernels):
    expected, arrays = reference(variant)
    result = first_step(engine_for(variant, kernels), expected)
    assert result["token_ids"] == expected["greedy"]
    check_top_logprobs(result["logprobs"][0].top, arrays["logits"], 5, atol=1e-3)


@pytest.mark.parametrize("variant", VARIANTS)
def test_soft_tokens_equal_transformers_image_features(variant):
    engine = engine_for(variant)
    _, arrays = reference(variant)
    view = engine.vision.prepare((FIXTURE / "image.png").read_bytes()).views[0]
    ours = np.asarray(engine.runner.images.vision.encode_image(view))
    want = arrays["image_features"]
    assert ours.shape == want.shape == (66, 48)
    close_to_scale(ours, want)


def test_the_image_path_is_what_the_config_says():
    bidirectional, ple = engine_for("bidirectional"), engine_for("ple")
    assert bidirectional.runner.images.two_way and not ple.runner.images.two_way
    layers = bidirectional.runner.model.layers
    # sliding layers (0 and 2) honour the image spans, global ones (1 and 3) stay causal
    assert [layer.attn.spec.image_spans for layer in layers] == [True, False, True, False]


def _top_logprobs(engine: LLMEngine, expected: dict) -> np.ndarray:
    return np.array([lp for _, lp in first_step(engine, expected)["logprobs"][0].top])


def test_a_causal_image_path_would_be_caught():
    engine = engine_for("bidirectional")
    expected, arrays = reference("bidirectional")
    want = np.sort(log_softmax(arrays["logits"]))[::-1][:5]
    engine.runner.images.two_way = False
    try:
        causal = _top_logprobs(engine, expected)
    finally:
        engine.runner.images.two_way = True
    assert np.abs(causal - want).max() > 1e-2


def test_the_image_tokens_own_per_layer_inputs_would_be_caught():
    engine = engine_for("ple")
    expected, arrays = reference("ple")
    want = np.sort(log_softmax(arrays["logits"]))[::-1][:5]
    inputs = engine.runner.model.per_layer_inputs
    image_token = expected["token_ids"][8]
    inputs.pad_id = image_token  # the soft tokens' rows keep the image token's own lookup
    try:
        own = _top_logprobs(engine, expected)
    finally:
        inputs.pad_id = 0
    assert np.abs(own - want).max() > 1e-2


def test_global_layers_honouring_the_spans_would_be_caught():
    engine = engine_for("bidirectional")
    expected, arrays = reference("bidirectional")
    want = np.sort(log_softmax(arrays["logits"]))[::-1][:5]
    layers = [layer.attn for layer in engine.runner.model.layers]
    specs = [attn.spec for attn in layers]
    for attn in layers:
        attn.spec = dataclasses.replace(attn.spec, image_spans=True)
    try:
        everywhere = _top_logprobs(engine, expected)
    finally:
        for attn, spec in zip(layers, specs, strict=True):
            attn.spec = spec
    assert np.abs(everywhere - want).max() > 1e-2


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_images_in_chunks_and_from_the_prefix_cache_equal_transformers(variant):
    """Both fixture images in one prompt (141 tokens: one two-way span per image), prefilled in chunks of
    at most 72 tokens (the scheduler cuts the first chunk before the first image, which then goes whole),
    then asked again with the prompt's KV from the prefix cache."""
    expected, arrays = reference(variant)
    config = EngineConfig(
        model=str(FIXTURE / variant / "hf"),
        device="cpu",
        max_model_len=256,
        block_size=4,
        max_num_batched_tokens=72,
    )
    engine = LLMEngine(config)
    views = [engine.vision.prepare((FIXTURE / f"{n}.png").read_bytes()).views[0] for n in ("image", "wide")]
    params = SamplingParams(temperature=0.0, max_tokens=len(expected["two_greedy"]), logprobs=5)
    want = log_softmax(arrays["two_logits"].reshape(-1))
    for attempt in ("fresh", "cached"):
        result = engine.generate([expected["two_token_ids"]], params, images=[views])[0]
        assert result["token_ids"] == expected["two_greedy"], attempt
        assert (result["num_cached_tokens"] > 0) == (attempt == "cached")
        top = result["logprobs"][0].top
        assert [t for t, _ in top] == list(np.argsort(-want)[:5]), attempt
        np.testing.assert_allclose([lp for _, lp in top], np.sort(want)[::-1][:5], atol=1e-3, err_msg=attempt)
