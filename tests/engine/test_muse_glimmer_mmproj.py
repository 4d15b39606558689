"""Muse Glimmer from the GGUF pair llama.cpp's converter makes (a `muse-glimmer` text GGUF + a `muse-glimmer`
mmproj), written at test time with gguf-py's writer from the tiny vision fixture's HF folder
(muse_glimmer_gguf.py: `write_gguf`, `write_mmproj`, following the converter), against transformers'
references for that folder (tests/fixtures/make_muse_glimmer_vision_reference.py). The text GGUF is written as
F32 so both files hold the folder's float32 weights exactly; the mmproj's patch embedding has its temporal
halves summed and its q/k rows permuted as llama.cpp's, which the reader undoes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from family_parity import close_to_scale
from muse_glimmer_gguf import write_gguf, write_mmproj

from app.engine.backend.cpu import CpuBackend
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.loader.names import CheckpointError
from app.engine.models.vision.muse_glimmer_mmproj import load_muse_glimmer_mmproj
from app.engine.models.vision.muse_glimmer_vision import MuseGlimmerVisionTower
from app.engine.plan.fit import shape_from_checkpoint
from app.engine.sampling_params import SamplingParams

FIXTURES = Path(__file__).parents[1] / "fixtures"
VISION = FIXTURES / "muse_glimmer_vision"
ENGINE = json.loads((VISION / "engine.json").read_text())
IMAGE_TOKENS = {"<|image_start|>": 256, "<|image_end|>": 257, "<|patch|>": 258, "<|video|>": 259}
MMPROJ = "mmproj-muse-glimmer-F32.gguf"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    """A folder holding the text GGUF and its mmproj; the text GGUF's path."""
    folder = tmp_path_factory.mktemp("muse_glimmer_gguf")
    text = folder / "muse-glimmer-F32.gguf"
    write_gguf(VISION / "hf", text, gguf.GGMLQuantizationType.F32, image_tokens=IMAGE_TOKENS)
    write_mmproj(VISION / "hf", folder / MMPROJ)
    return text


@pytest.fixture(scope="module")
def ref():
    with np.load(VISION / "reference.npz") as data:
        return dict(data)


@pytest.mark.parametrize("name", ["image", "wide"])
def test_the_mmproj_tower_equals_transformers(pair, ref, name):
    tower = MuseGlimmerVisionTower(CpuBackend(), *load_muse_glimmer_mmproj(pair.parent / MMPROJ, 64, 1e-5))
    grid = tuple(int(v) for v in ref[f"{name}.grid_thw"])
    frame = ref[f"{name}.pixel_values"][:, : 3 * 4 * 4]  # the file's patch embedding reads one frame
    expected = ref[f"{name}.features"]
    out = np.asarray(tower.encode(frame, grid))
    close_to_scale(out, expected)


def test_an_f16_mmproj_keeps_its_format_and_nearly_the_same_features(tmp_path, ref):
    """The converter's default file type: matrices F16 (q/k come back as F32, re-ordered), vectors F32."""
    path = tmp_path / "mmproj-f16.gguf"
    write_mmproj(VISION / "hf", path, qtype=gguf.GGMLQuantizationType.F16)
    cfg, tensors = load_muse_glimmer_mmproj(path, 64, 1e-5)
    assert tensors["tower.layers.0.mlp.fc1.weight"].qtype.name == "F16"
    assert tensors["projection.weight"].qtype.name == "F16"
    frame = ref["wide.pixel_values"][:, :48]
    out = np.asarray(MuseGlimmerVisionTower(CpuBackend(), cfg, tensors).encode(frame, (1, 6, 16)))
    expected = ref["wide.features"]
    close_to_scale(out, expected, 3e-3)  # measured 5e-4


def test_the_gguf_pair_answers_an_image_as_the_hf_folder(pair, ref):
    engine = LLMEngine(EngineConfig(model=str(pair), device="cpu", max_model_len=256, block_size=4))
    (view,) = engine.vision.prepare((VISION / "image.png").read_bytes()).views
    # llama.cpp's cap (4096 tokens) leaves this image at the grid the folder's 24-token cap gives it
    assert view.grid_thw == tuple(ref["image.grid_thw"])
    np.testing.assert_allclose(view.pixel_values, ref["image.pixel_values"][:, :48], atol=1e-6, rtol=0)
    params = SamplingParams(temperature=0.0, max_tokens=len(ENGINE["greedy"]))
    [result] = engine.generate([ENGINE["token_ids"]], params, images=[[view]])
    assert result["token_ids"] == ENGINE["greedy"]


def test_an_mmproj_given_by_path_is_used(pair, tmp_path):
    alone = tmp_path / "text.gguf"
    shutil.copy(pair, alone)
    assert LLMEngine(EngineConfig(model=str(alone), device="cpu", max_model_len=64)).vision is None
    given = LLMEngine(
        EngineConfig(model=str(alone), device="cpu", max_model_len=64, mmproj=str(pair.parent / MMPROJ))
    )
    assert given.vision is not None and given.vision.image_token_id == IMAGE_TOKENS["<|patch|>"]


def test_a_truncated_mmproj_is_named_with_its_tensor(pair, tmp_path):
    data = (pair.parent / MMPROJ).read_bytes()
    broken = tmp_path / "mmproj-truncated.gguf"
    broken.write_bytes(data[: len(data) - 3000])
    with pytest.raises(CheckpointError, match=r"mmproj-truncated\.gguf: file is truncated: tensor '[\w.]+' ends at"):
        load_muse_glimmer_mmproj(broken, 64, 1e-5)


@pytest.mark.parametrize(
    ("replace", "named"),
    [
        ({"v.blk.1.attn_k.weight": np.zeros((32, 16), np.float32)},
         r"tensor v\.blk\.1\.attn_k\.weight has shape \(32, 16\), expected \(32, 32\)"),
        ({"v.blk.3.ln2.bias": None}, r"the mmproj lacks v\.blk\.3\.ln2\.bias"),
        ({"v.blk.0.attn_qkv.weight": np.zeros((96, 32), np.float32)},
         r"the mmproj holds v\.blk\.0\.attn_qkv\.weight, which a Muse Glimmer tower has not"),
    ],
)  # fmt: skip
def test_a_tensor_misshapen_missing_or_foreign_is_named_with_the_file(tmp_path, replace, named):
    broken = tmp_path / "mmproj-bad.gguf"
    write_mmproj(VISION / "hf", broken, replace=replace)
    with pytest.raises(CheckpointError, match=rf"mmproj-bad\.gguf: {named}"):
        load_muse_glimmer_mmproj(broken, 64, 1e-5)


def test_an_mmproj_of_another_model_is_named(pair):
    other = FIXTURES / "vision" / "gemma3" / "mmproj-gemma3.gguf"
    with pytest.raises(CheckpointError, match=r"mmproj-gemma3\.gguf: mmproj projector type 'gemma3' is not Muse Glimmer's"):
        load_muse_glimmer_mmproj(other, 64, 1e-5)
    with pytest.raises(CheckpointError, match="projection_dim is 64, the text model's hidden size 96"):
        load_muse_glimmer_mmproj(pair.parent / MMPROJ, 96, 1e-5)


def test_will_it_fit_counts_the_tower_from_the_mmproj(pair):
    shape = shape_from_checkpoint(pair)
    vision = shape.vision
    assert vision is not None and vision.source == MMPROJ
    from app.engine.loader.gguf import read_gguf

    assert vision.weight_bytes == sum(t.nbytes for t in read_gguf(pair.parent / MMPROJ).tensors.values())
    # sized at llama.cpp's largest image: 4096 merged cells of 2x2 patches, all in one full-attention layer
    assert vision.patches == 4096 * 4
    assert vision.activation_bytes() >= (4096 * 4) ** 2 * 4


def test_will_it_fit_counts_the_folders_tower_at_its_token_cap():
    shape = shape_from_checkpoint(VISION / "hf")
    vision = shape.vision
    assert vision is not None and vision.patches == 24 * 4  # preprocessor_config.json's max_image_tokens
    from safetensors.numpy import load_file

    tensors = load_file(VISION / "hf" / "model.safetensors")
    side = ("model.vision_tower.", "model.vision_adapter.", "model.vision_projection.")
    assert vision.weight_bytes == sum(t.nbytes for n, t in tensors.items() if n.startswith(side))
