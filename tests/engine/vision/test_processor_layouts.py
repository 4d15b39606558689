"""Folders saved by transformers 5: the image processor's settings only in processor_config.json
(under "image_processor"), no preprocessor_config.json.

`tests/fixtures/vision/gemma3/transformers5/processor_config.json` is what Gemma3Processor's
save_pretrained wrote for the fixture's settings (tests/fixtures/make_vision_reference.py); the
folders here are the existing fixtures with their settings moved into that layout, checked
against the same transformers references as the old layout (test_vision_engine.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from family_parity import check_top_logprobs
from PIL import Image

from app.cli import main
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.loader.names import CheckpointError
from app.engine.loader.processor_config import read_processor_settings
from app.engine.models.vision.image_processing import preprocess
from app.engine.models.vision.qwen_vl_weights import load_qwen_vision
from app.engine.models.vision.weights import load_hf_vision
from app.engine.plan.fit import shape_from_checkpoint
from app.engine.sampling_params import SamplingParams
from app.studio.library import describe_safetensors_folder

FIXTURES = Path(__file__).parents[2] / "fixtures" / "vision"
GEMMA = FIXTURES / "gemma3" / "hf"
SAVED_BY_TRANSFORMERS5 = FIXTURES / "gemma3" / "transformers5" / "processor_config.json"
QWEN = FIXTURES / "qwen2_5_vl" / "hf"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
TOP = 5


def _without_preprocessor(source: Path, target: Path) -> Path:
    target.mkdir()
    for file in source.iterdir():
        if file.name != "preprocessor_config.json":
            (target / file.name).symlink_to(file)
    return target


@pytest.fixture(scope="module")
def gemma_v5(tmp_path_factory) -> Path:
    folder = _without_preprocessor(GEMMA, tmp_path_factory.mktemp("gemma3") / "hf")
    shutil.copy(SAVED_BY_TRANSFORMERS5, folder / "processor_config.json")
    return folder


@pytest.fixture(scope="module")
def qwen_v5(tmp_path_factory) -> Path:
    folder = _without_preprocessor(QWEN, tmp_path_factory.mktemp("qwen") / "hf")
    settings = json.loads((QWEN / "preprocessor_config.json").read_text())
    (folder / "processor_config.json").write_text(
        json.dumps({"image_processor": settings, "processor_class": "Qwen2_5_VLProcessor"})
    )
    return folder


def test_transformers5_saved_the_same_settings_in_the_new_layout():
    saved = json.loads(SAVED_BY_TRANSFORMERS5.read_text())
    assert saved["image_processor"] == json.loads((GEMMA / "preprocessor_config.json").read_text())


def test_both_layouts_give_the_same_vision_config(gemma_v5, qwen_v5):
    config = json.loads((GEMMA / "config.json").read_text())
    old, new = load_hf_vision(GEMMA, config)[0], load_hf_vision(gemma_v5, config)[0]
    assert new == old and new.image_size == 56 and new.pan_and_scan is not None
    qwen_config = json.loads((QWEN / "config.json").read_text())
    assert load_qwen_vision(qwen_v5, qwen_config)[0] == load_qwen_vision(QWEN, qwen_config)[0]


def test_pan_and_scan_pixels_match_the_hf_processor(gemma_v5):
    config = load_hf_vision(gemma_v5, json.loads((gemma_v5 / "config.json").read_text()))[0]
    with np.load(FIXTURES / "references.npz") as refs:
        reference = refs["pixels/wide"]
    processed = preprocess(Image.open(FIXTURES / "images" / "wide.png"), config)
    assert processed.num_crops == MANIFEST["num_crops"]["wide"] > 0
    np.testing.assert_allclose(processed.pixel_values, reference, rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))
def test_the_engine_answers_as_transformers_on_the_new_layout(gemma_v5, case):
    engine = LLMEngine(EngineConfig(model=str(gemma_v5), device="cpu", max_model_len=256, block_size=4))
    spec = MANIFEST["cases"][case]
    views = [
        engine.vision.prepare((FIXTURES / "images" / f"{n}.png").read_bytes()).views[0]
        for n in spec["images"]
    ]
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=TOP)
    result = engine.generate([spec["token_ids"]], params, images=[views])[0]
    with np.load(FIXTURES / "references.npz") as refs:
        row = refs[f"logits/{case}"][-1]
    check_top_logprobs(result["logprobs"][0].top, row, TOP, atol=1e-4)


def test_generate_with_an_image_runs_on_the_new_layout(gemma_v5, capsys):
    # The failure: exit 2, "preprocessor_config.json size {896} differs from ... 224".
    image = str(FIXTURES / "images" / "odd_rgba.png")
    args = [
        "generate",
        "--model",
        str(gemma_v5),
        "--device",
        "cpu",
        "--temperature",
        "0",
        "--max-tokens",
        "2",
    ]
    code = main([*args, "--json", "--chat", "--image", image, "Hello"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)["prompt_token_ids"].count(MANIFEST["image_token_id"]) == 16


def test_will_it_fit_and_the_library_read_the_new_layout(qwen_v5, gemma_v5):
    assert shape_from_checkpoint(qwen_v5).vision == shape_from_checkpoint(QWEN).vision
    files = tuple(sorted(gemma_v5.glob("*.safetensors")))
    entry = describe_safetensors_folder(gemma_v5, files, "gemma-v5")
    assert entry.error is None and entry.vision == "hf/*.safetensors"
    assert entry.shape.vision.image_size == 56


def test_the_nested_settings_win_over_the_old_file(tmp_path):
    # as transformers' loaders: processor_config.json's image_processor first, the old file only without it
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 896, "width": 896}}))
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": {"size": {"height": 56}}}))
    found = read_processor_settings(tmp_path, "image_processor")
    assert (
        found.values == {"size": {"height": 56}} and found.source == "processor_config.json image_processor"
    )
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"processor_class": "X", "video_processor": {}})
    )
    assert read_processor_settings(tmp_path, "image_processor").source == "preprocessor_config.json"
    assert read_processor_settings(tmp_path, "video_processor").values == {}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({"fps": 2}))
    assert read_processor_settings(tmp_path, "video_processor").values == {}  # the nested one, empty
    (tmp_path / "processor_config.json").unlink()
    assert read_processor_settings(tmp_path, "video_processor").values == {"fps": 2}
    (tmp_path / "preprocessor_config.json").unlink()
    assert read_processor_settings(tmp_path, "feature_extractor").values == {}


def test_bad_processor_files_are_named(gemma_v5, tmp_path):
    config = json.loads((GEMMA / "config.json").read_text())
    folder = _without_preprocessor(gemma_v5, tmp_path / "broken")
    (folder / "processor_config.json").unlink()
    (folder / "processor_config.json").write_text('{"image_processor": {"size": ')
    with pytest.raises(CheckpointError, match=r"processor_config.json: not valid JSON \(Expecting value"):
        load_hf_vision(folder, config)
    (folder / "processor_config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match=r"processor_config\.json: not UTF-8 text"):
        load_hf_vision(folder, config)
    (folder / "processor_config.json").write_text('{"image_processor": [1, 2]}')
    with pytest.raises(
        CheckpointError, match=r"processor_config\.json: image_processor is a list, not an object"
    ):
        load_hf_vision(folder, config)
    (folder / "processor_config.json").write_text("[]")
    with pytest.raises(CheckpointError, match=r"processor_config\.json: holds a JSON list"):
        load_hf_vision(folder, config)
    (folder / "processor_config.json").write_text(json.dumps({"image_processor": {"size": {"height": 896}}}))
    with pytest.raises(
        CheckpointError, match=r"processor_config\.json image_processor size .* differs from vision_config"
    ):
        load_hf_vision(folder, config)
    (folder / "processor_config.json").unlink()
    with pytest.raises(CheckpointError, match=r"image_processor's defaults \(no processor_config.json or "
                       r"preprocessor_config.json\) size .*896.* differs from "
        r"vision_config image_size 56"):  # fmt: skip
        load_hf_vision(folder, config)
