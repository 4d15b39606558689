"""PaddleOCR-VL from the GGUF pair llama.cpp publishes (a `paddleocr` text GGUF + a `paddleocr`
mmproj), written at test time by tests/fixtures/make_paddleocr_vl_gguf.py with gguf-py from the tiny HF
fixture, against that fixture's transformers outputs; and the errors a corrupt, truncated or
wrong-kind file of this family gets (each naming the file and the problem), from either layout and
as the Documents pane's OCR model."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from family_parity import close_to_scale

from app.engine.backend.cpu import CpuBackend
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.loader.names import CheckpointError
from app.engine.loader.weights import open_checkpoint
from app.engine.models.vision import PaddleVisionTower, load_vision
from app.engine.models.vision.image_processing import ImageError
from app.engine.models.vision.paddleocr_processing import preprocess_paddle
from app.engine.sampling_params import SamplingParams
from app.engine.tasks.ocr import PageReader, is_ocr_model

FIXTURES = Path(__file__).parents[2] / "fixtures"
sys.path.insert(0, str(FIXTURES))
import make_paddleocr_vl_gguf  # noqa: E402  (beside the other fixture scripts, not a package)

PADDLE = FIXTURES / "vision" / "paddleocr_vl"
HF = PADDLE / "hf"
MANIFEST = json.loads((PADDLE / "manifest.json").read_text())
PAGES = sorted(MANIFEST["grids"])
QWEN_HF = FIXTURES / "vision" / "qwen2_5_vl" / "hf"
GEMMA_MMPROJ = FIXTURES / "vision" / "gemma3" / "mmproj-gemma3.gguf"


@pytest.fixture(scope="module")
def refs():
    with np.load(PADDLE / "references.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_paddleocr_vl_gguf.write_pair(tmp_path_factory.mktemp("paddle-gguf"))


@pytest.fixture(scope="module")
def engine(pair) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(pair[0]), device="cpu", max_model_len=256, block_size=4))


@pytest.mark.parametrize("name", PAGES)
def test_the_gguf_pair_gives_transformers_greedy_tokens(engine, name):
    (view,) = engine.vision.prepare((PADDLE / "images" / f"{name}.png").read_bytes()).views
    params = SamplingParams(temperature=0.0, max_tokens=len(MANIFEST["greedy"][name]))
    result = engine.generate([MANIFEST["prompts"][name]], params, images=[[view]])[0]
    assert result["token_ids"] == MANIFEST["greedy"][name]


@pytest.mark.parametrize("name", PAGES)
def test_the_mmproj_tower_matches_transformers(engine, refs, name):
    tower = engine.runner.images.vision
    assert isinstance(tower, PaddleVisionTower)
    pixels = refs[f"pixels/{name}"]
    grid = tuple(MANIFEST["grids"][name])
    hidden = tower.tower(pixels.reshape(len(pixels), -1), grid)
    close_to_scale(hidden, refs[f"tower/{name}"])
    close_to_scale(tower.project(hidden, grid), refs[f"features/{name}"])


def test_the_mmproj_says_what_the_hf_folder_says(pair):
    from_gguf = load_vision(open_checkpoint(pair[0]), CpuBackend()).config
    from_hf = load_vision(open_checkpoint(HF), CpuBackend()).config
    # image_size holds sqrt(max_pixels) there: the position grid comes from its table's rows; the
    # epsilon is stored as a float32
    assert dataclasses.replace(from_gguf, layer_norm_eps=from_hf.layer_norm_eps) == from_hf
    assert from_gguf.layer_norm_eps == pytest.approx(from_hf.layer_norm_eps)
    assert from_gguf.position_grid == 4 and from_gguf.max_pixels == 28 * 28 * 20
    cfg = open_checkpoint(pair[0])
    assert cfg.architecture == "paddleocr"


def test_is_ocr_model_reads_the_folder_and_the_gguf_header(pair):
    assert is_ocr_model(HF) and is_ocr_model(pair[0])
    assert not is_ocr_model(QWEN_HF) and not is_ocr_model(pair[1].with_name("absent.gguf"))


# -- bad files -------------------------------------------------------------------------------


def _copy_hf(tmp_path: Path) -> Path:
    folder = tmp_path / "paddle"
    shutil.copytree(HF, folder)
    return folder


def test_a_truncated_text_gguf_is_named(pair, tmp_path):
    cut = tmp_path / pair[0].name
    cut.write_bytes(pair[0].read_bytes()[: pair[0].stat().st_size // 2])
    with pytest.raises(
        CheckpointError, match=rf"{cut}: file is truncated: tensor 'blk\.\d+\.\w+\.weight' ends"
    ):
        open_checkpoint(cut)


def test_a_truncated_mmproj_is_named(pair, tmp_path):
    shutil.copy(pair[0], tmp_path / pair[0].name)
    cut = tmp_path / pair[1].name
    cut.write_bytes(pair[1].read_bytes()[:4000])
    with pytest.raises(CheckpointError, match=rf"{cut}: tensor '.+' .* more than the 4000-byte file holds"):
        LLMEngine(EngineConfig(model=str(tmp_path / pair[0].name), device="cpu", max_model_len=64))


def test_another_models_mmproj_is_refused_by_its_projector_type(pair):
    with pytest.raises(
        CheckpointError, match=rf"{GEMMA_MMPROJ}: mmproj projector type 'gemma3' is not PaddleOCR-VL's"
    ):
        load_vision(open_checkpoint(pair[0]), CpuBackend(), GEMMA_MMPROJ)


def test_a_folder_without_its_projector_names_what_it_lacks(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = _copy_hf(tmp_path)
    weights = load_file(folder / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if not k.startswith("mlp_AR.linear_2")},
        folder / "model.safetensors",
    )
    with pytest.raises(CheckpointError, match=rf"{folder}: the vision checkpoint lacks mm.2.weight"):
        load_vision(open_checkpoint(folder), CpuBackend())


def test_a_processor_config_for_video_frames_is_refused_by_name(tmp_path):
    folder = _copy_hf(tmp_path)
    settings = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps({**settings, "temporal_patch_size": 2}))
    with pytest.raises(
        CheckpointError, match=r"preprocessor_config\.json temporal_patch_size 2: PaddleOCR-VL takes one"
    ):
        load_vision(open_checkpoint(folder), CpuBackend())


def test_a_broken_config_json_is_named(tmp_path):
    folder = _copy_hf(tmp_path)
    (folder / "config.json").write_text('{"architectures": ["PaddleOCRVLForConditionalGeneration"]')
    with pytest.raises(CheckpointError, match=rf"{folder}/config\.json: cannot read config\.json: Expecting"):
        open_checkpoint(folder)


def test_a_truncated_safetensors_file_is_named(tmp_path):
    folder = _copy_hf(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(
        CheckpointError, match=rf"{weights}: header length \d+ does not fit the 5000-byte file"
    ):
        open_checkpoint(folder)


def test_an_ocr_model_of_another_kind_is_refused(tmp_path, pair):
    with pytest.raises(
        CheckpointError, match=rf"OCR model {QWEN_HF}: it is a qwen2vl model, not PaddleOCR-VL"
    ):
        PageReader.load(QWEN_HF, device="cpu", context=256)
    alone = tmp_path / pair[0].name
    shutil.copy(pair[0], alone)  # no mmproj beside it
    with pytest.raises(CheckpointError, match=rf"OCR model {alone}: no vision tower found"):
        PageReader.load(alone, device="cpu", context=256)


def test_a_page_that_is_no_image_is_refused_in_words():
    reader = PageReader.load(HF, device="cpu", context=256, max_reply_tokens=2)
    with pytest.raises(ImageError, match="image could not be decoded"):
        reader.read(b"%PDF-1.4 not an image")
    assert reader.read_ids((PADDLE / "images" / "wide.png").read_bytes()) == MANIFEST["greedy"]["wide"][:2]


def test_a_preprocessed_page_of_the_gguf_pair_is_the_folders(engine):
    from PIL import Image

    page = Image.open(PADDLE / "images" / "portrait.png")
    a, grid = preprocess_paddle(page, engine.vision.config)
    (view,) = engine.vision.prepare((PADDLE / "images" / "portrait.png").read_bytes()).views
    assert view.grid_thw == grid and np.array_equal(view.pixel_values, a)


# -- will-it-fit -----------------------------------------------------------------------------


def test_will_it_fit_counts_the_tower_apart_and_sizes_it_at_the_largest_page(pair):
    import gguf

    from app.engine.plan.fit import shape_from_checkpoint

    processor = json.loads((HF / "preprocessor_config.json").read_text())
    largest = (
        processor["max_pixels"] // processor["patch_size"] ** 2
    )  # every layer attends over the whole page
    mmproj_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(pair[1]).tensors)
    text_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(pair[0]).tensors)
    from_gguf, from_hf = shape_from_checkpoint(pair[0]), shape_from_checkpoint(HF)
    assert (from_gguf.weight_bytes, from_gguf.vision.weight_bytes) == (text_bytes, mmproj_bytes)
    assert from_gguf.vision.source == pair[1].name
    # the folder's text tensors and its tower + projector (visual.*, mlp_AR.*) as the GGUF pair splits them
    assert (from_hf.weight_bytes, from_hf.vision.weight_bytes) == (text_bytes, mmproj_bytes)
    for vision in (from_gguf.vision, from_hf.vision):
        assert vision.patches == largest == 80
        assert (vision.hidden_size, vision.num_heads, vision.intermediate_size) == (32, 2, 48)


def test_the_gguf_pair_reads_a_page_as_the_ocr_model(pair):
    # the chat template travels in the GGUF (tokenizer.chat_template), the tower in the mmproj beside it
    reader = PageReader.load(pair[0], device="cpu", context=256, max_reply_tokens=4)
    assert (
        reader.read_ids((PADDLE / "images" / "portrait.png").read_bytes())
        == MANIFEST["greedy"]["portrait"][:4]
    )


# The published chat_template.jinja's user turn: it reads content only as a list of typed parts.
PUBLISHED_TEMPLATE = """{%- if not cls_token is defined -%}{%- set cls_token = "<|begin_of_sentence|>" -%}{%- endif -%}
{%- if not image_token is defined -%}
{%- set image_token = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>" -%}{%- endif -%}
{{- cls_token -}}
{%- for message in messages -%}{%- if message["role"] == "user" -%}{{- "User: " -}}
{%- for content in message["content"] -%}{%- if content["type"] == "image" -%}{{ image_token }}{%- endif -%}{%- endfor -%}
{%- for content in message["content"] -%}{%- if content["type"] == "text" -%}{{ content["text"] }}{%- endif -%}
{%- endfor -%}{{ "\\n" -}}{%- endif -%}{%- endfor -%}
{%- if add_generation_prompt -%}{{- "Assistant: " -}}{%- endif -%}"""


def test_a_template_that_reads_only_content_parts_is_replaced_by_the_built_in(tmp_path):
    folder = _copy_hf(tmp_path)
    (folder / "chat_template.jinja").write_text(PUBLISHED_TEMPLATE)
    reader = PageReader.load(folder, device="cpu", context=256, max_reply_tokens=3)
    template = reader.task.engine.chat_template
    assert template.source == "builtin:paddleocr" and "renders no message text" in template.refused
    # the built-in writes what the published template writes for parts: a whole conversation too
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
             {"role": "user", "content": "OCR:"}]  # fmt: skip
    assert (
        template.render(turns) == "<|begin_of_sentence|>User: Hi\nAssistant: Hello</s>User: OCR:\nAssistant: "
    )
    assert reader.read_ids((PADDLE / "images" / "wide.png").read_bytes()) == MANIFEST["greedy"]["wide"][:3]
    engine = reader.task.engine
    image = engine.vision.prepare((PADDLE / "images" / "wide.png").read_bytes())
    assert reader.prompt_ids(image) == MANIFEST["prompts"]["wide"]


def test_an_f16_mmproj_tower_stays_close_to_transformers(tmp_path, refs):
    text, _ = make_paddleocr_vl_gguf.write_pair(tmp_path, mmproj_type="F16")
    tower = load_vision(open_checkpoint(text), CpuBackend())
    for name in PAGES:  # weights rounded to F16: within 1 % of the float32 reference's scale
        pixels, grid = refs[f"pixels/{name}"], tuple(MANIFEST["grids"][name])
        hidden = tower.tower(pixels.reshape(len(pixels), -1), grid)
        close_to_scale(tower.project(hidden, grid), refs[f"features/{name}"], rel=1e-2)


def test_an_mmproj_without_its_3_channel_mean_and_std_is_refused(pair):
    """qwen_vl_mmproj.image_mean_std, which the Qwen2.5-VL, PaddleOCR-VL and Muse Glimmer readers share."""
    from app.engine.loader.gguf import read_gguf
    from app.engine.models.vision.paddleocr_mmproj import paddle_config_from_gguf
    from app.engine.models.vision.weights import find_mmproj

    file = read_gguf(find_mmproj(pair[0]))
    meta, tensors = dict(file.metadata), dict(file.tensors)
    hidden = load_vision(open_checkpoint(HF), CpuBackend()).config.text_hidden_size
    read = paddle_config_from_gguf(meta, tensors, hidden)
    assert read.image_std == tuple(meta["clip.vision.image_std"]) and len(read.image_mean) == 3
    for broken in ({**meta, "clip.vision.image_std": [0.5, 0.5]}, {**meta, "clip.vision.image_mean": 0.5},
                   {k: v for k, v in meta.items() if k != "clip.vision.image_mean"}):  # fmt: skip
        with pytest.raises(CheckpointError, match=r"lacks the 3-channel clip\.vision\.image_mean / image_std"):
            paddle_config_from_gguf(broken, tensors, hidden)
