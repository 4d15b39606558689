"""Gemma 3 vision on CUDA against the numpy backend (tests/fixtures/vision, tiny random weights):
the tower's soft tokens, and the engine's first-token logprobs with images in the prompt (one
prefill chunk with two-way image attention, then a prefix-cache hit over the images)."""

from __future__ import annotations

import json
import shutil
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


def test_qwen_tower_matches_numpy(cuda, cpu) -> None:
    """Qwen2.5-VL's tower (window and full attention, 2D RoPE, merger) on every fixture image."""
    from app.engine.loader.weights import open_checkpoint
    from app.engine.models.vision import load_vision

    folder = FIXTURES / "qwen2_5_vl"
    manifest = json.loads((folder / "manifest.json").read_text())
    checkpoint = open_checkpoint(folder / "hf")
    ours, reference = load_vision(checkpoint, cuda), load_vision(checkpoint, cpu)
    with np.load(folder / "references.npz") as refs:
        for name, grid in manifest["grids"].items():
            pixels, grid = refs[f"pixels/{name}"], tuple(grid)
            for got, want in zip(ours.tower(pixels, grid), reference.tower(pixels, grid), strict=True):
                want = np.asarray(want)
                scale = max(1.0, float(np.abs(want).max()))
                np.testing.assert_allclose(cuda.to_host(got), want, rtol=0, atol=2e-3 * scale, err_msg=name)


def _widened(source: Path, out: Path, rng: np.random.Generator) -> Path:
    """The fixture folder with its text model's heads widened to head_dim 64, the smallest the CUDA
    rope and attention kernels take (the fixture's 16 is below it): new random attention weights of
    the wider shapes, every other tensor (the vision tower, the projector, the MLPs) as it was.
    Qwen2.5-VL derives head_dim from hidden / heads, so it keeps one head and one KV head of 64, and
    its M-RoPE sections grow fourfold with the head."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(source, out)
    config = json.loads((out / "config.json").read_text())
    text = config["text_config"]
    if text["model_type"].startswith("qwen2_5_vl"):
        text["num_attention_heads"] = text["num_key_value_heads"] = 1
        sections = text["rope_parameters"]["mrope_section"]
        text["rope_parameters"]["mrope_section"] = [4 * n for n in sections]
    elif text["model_type"] == "gemma4_text":  # its global layers' heads too
        text["head_dim"] = text["global_head_dim"] = 64
    else:
        text["head_dim"] = text["query_pre_attn_scalar"] = 64
    (out / "config.json").write_text(json.dumps(config))
    hidden, heads, kv = text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"]
    head_dim = 64
    shapes = {"q_proj.weight": (heads * head_dim, hidden), "k_proj.weight": (kv * head_dim, hidden),
              "v_proj.weight": (kv * head_dim, hidden), "o_proj.weight": (hidden, heads * head_dim),
              "q_proj.bias": (heads * head_dim,), "k_proj.bias": (kv * head_dim,), "v_proj.bias": (kv * head_dim,),
              "q_norm.weight": (head_dim,), "k_norm.weight": (head_dim,)}  # fmt: skip
    tensors = load_file(out / "model.safetensors")
    for name in list(tensors):
        suffix = ".".join(name.split(".")[-2:])
        if ".self_attn." in name and "vision" not in name and "visual" not in name and suffix in shapes:
            scale = 0.1 if suffix.endswith("norm.weight") else shapes[suffix][-1] ** -0.5
            tensors[name] = (rng.standard_normal(shapes[suffix]) * scale).astype(np.float32)
    save_file(tensors, out / "model.safetensors")
    return out


def _first_tokens(model: Path, images_dir: Path, spec: dict, device: str, graphs: bool) -> list[dict]:
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    engine = LLMEngine(
        EngineConfig(model=str(model), device=device, max_model_len=256, block_size=16, cuda_graphs=graphs)
    )
    images = [engine.vision.prepare((images_dir / f"{n}.png").read_bytes()).views[0] for n in spec["images"]]
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=5)
    first = engine.generate([spec["token_ids"]], params, images=[images])[0]
    again = engine.generate([spec["token_ids"]], params, images=[images])[0]  # images from the prefix cache
    assert again["num_cached_tokens"] > 0
    return [first, again]


FAMILIES = {
    "gemma3": (HF, FIXTURES / "images", MANIFEST),
    "qwen2_5_vl": (
        FIXTURES / "qwen2_5_vl" / "hf",
        FIXTURES / "qwen2_5_vl" / "images",
        json.loads((FIXTURES / "qwen2_5_vl" / "manifest.json").read_text()),
    ),
}


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_engine_with_images_matches_numpy(cuda, tmp_path, family: str, graphs: bool) -> None:
    """Every generated token's top-5 logprobs, on a fresh prefill and on a prefix-cache hit over the
    images; Gemma 3's image tokens attend both ways, Qwen2.5-VL's rotate by M-RoPE positions (graphs
    on: the runner keeps such requests off the captured graphs)."""
    source, images_dir, manifest = FAMILIES[family]
    model = _widened(source, tmp_path / family, np.random.default_rng(7))
    for case in ("one_image", "two_images"):
        spec = manifest["cases"][case]
        reference = _first_tokens(model, images_dir, spec, "cpu", False)
        for got, ref in zip(_first_tokens(model, images_dir, spec, "cuda", graphs), reference, strict=True):
            assert got["token_ids"] == ref["token_ids"], case
            for got_step, ref_step in zip(got["logprobs"], ref["logprobs"], strict=True):
                for token, value in ref_step.top:
                    assert abs(dict(got_step.top).get(token, -99.0) - value) < 5e-2, case


GEMMA4 = Path(__file__).parents[2] / "fixtures" / "gemma4_vision"


@pytest.mark.parametrize("variant", ["bidirectional", "ple"])
def test_gemma4_engine_with_an_image_matches_numpy(cuda, tmp_path, variant: str) -> None:
    """Gemma 4's image paths on CUDA (the step with the image on the reference attention over CuPy):
    two-way on sliding layers only (`bidirectional`), the pad token's per-layer inputs at image positions
    (`ple`); every generated token's top-5 logprobs against the numpy engine's, fresh and from the prefix
    cache."""
    model = _widened(GEMMA4 / variant / "hf", tmp_path / variant, np.random.default_rng(7))
    spec = {
        "images": ["image"],
        "token_ids": json.loads((GEMMA4 / variant / "engine.json").read_text())["token_ids"],
    }
    reference = _first_tokens(model, GEMMA4, spec, "cpu", False)
    for got, ref in zip(_first_tokens(model, GEMMA4, spec, "cuda", True), reference, strict=True):
        assert got["token_ids"] == ref["token_ids"]
        for got_step, ref_step in zip(got["logprobs"], ref["logprobs"], strict=True):
            for token, value in ref_step.top:
                assert abs(dict(got_step.top).get(token, -99.0) - value) < 5e-2
