"""Gemma 3 vision on CUDA against the numpy backend (tests/fixtures/vision, tiny random weights):
the tower's soft tokens, and the engine's first-token logprobs with images in the prompt (one
prefill chunk with two-way image attention, then a prefix-cache hit over the images)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).parents[2] / "fixtures" / "vision"
HF = FIXTURES / "gemma3" / "hf"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def test_tower_soft_tokens_match_numpy(cuda, cpu) -> None:
    from app.engine.loader.weights import open_checkpoint
    from app.engine.models.vision import load_vision

    checkpoint = open_checkpoint(HF)
    with np.load(FIXTURES / "references.npz") as refs:
        pixels = refs["pixels/wide"][0]
    ours = cuda.to_host(load_vision(checkpoint, cuda).encode(pixels))
    reference = load_vision(checkpoint, cpu).encode(pixels)
    scale = max(1.0, float(np.abs(reference).max()))
    np.testing.assert_allclose(ours, reference, rtol=0, atol=2e-3 * scale)


def _first_tokens(device: str, graphs: bool) -> list[dict]:
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    engine = LLMEngine(
        EngineConfig(model=str(HF), device=device, max_model_len=256, block_size=16, cuda_graphs=graphs)
    )
    spec = MANIFEST["cases"]["two_images"]
    images = [
        engine.vision.prepare((FIXTURES / "images" / f"{n}.png").read_bytes()).views[0]
        for n in spec["images"]
    ]
    params = SamplingParams(temperature=0.0, max_tokens=3, logprobs=5)
    first = engine.generate([spec["token_ids"]], params, images=[images])[0]
    again = engine.generate([spec["token_ids"]], params, images=[images])[0]  # images from the prefix cache
    assert again["num_cached_tokens"] > 0
    return [first, again]


# Seen on the H200 (2026-12-02): the fixture's text model has head_dim 16, below what the CUDA
# rope/attention kernels take (multiples of 64), so the engine cannot run it on CUDA at all. The
# tower test above runs; this one waits for a fixture with head_dim >= 64.
@pytest.mark.skip(reason="vision fixture's head_dim 16 is below the CUDA kernels' 64 (needs a larger fixture)")
@pytest.mark.parametrize("graphs", [True, False])
def test_engine_with_images_matches_numpy(cuda, graphs: bool) -> None:
    reference = _first_tokens("cpu", False)
    for got, ref in zip(_first_tokens("cuda", graphs), reference, strict=True):
        for token, value in ref["logprobs"][0].top:
            assert abs(dict(got["logprobs"][0].top).get(token, -99.0) - value) < 5e-2
