"""Qwen2.5-VL from the GGUF pair llama.cpp publishes (a `qwen2vl` text GGUF + a `qwen2.5vl_merger`
mmproj) against transformers' reference outputs for the same weights.

tests/fixtures/make_qwen_vl_gguf.py converts the tiny random-weight HF fixture of
make_qwen_vl_reference.py into the pair with gguf-py's writer, following llama.cpp's converter
(it imports nothing of the engine); the references are that fixture's transformers outputs
(references.npz, manifest.json), so the GGUF path is held to transformers, not to the engine's
HF path. Tolerances are test_qwen_vl.py's: float32 tensors, float32 arithmetic in another order.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from family_parity import check_top_logprobs, close_to_scale
from PIL import Image

from app.cli import main as paddock
from app.engine.backend.cpu import CpuBackend
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.core.vision import NoVisionError
from app.engine.images import ImageInput
from app.engine.loader.gguf import read_gguf
from app.engine.loader.names import CheckpointError
from app.engine.loader.weights import open_checkpoint
from app.engine.models.qwen2_vl import config_from_gguf, config_from_hf
from app.engine.models.vision import QwenVisionModel, load_vision
from app.engine.models.vision.qwen_vl_mmproj import qwen_config_from_gguf, tower_tensors
from app.engine.models.vision.qwen_vl_processing import preprocess_qwen
from app.engine.plan.fit import shape_from_checkpoint
from app.engine.sampling_params import SamplingParams

FIXTURES = Path(__file__).parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
import make_qwen_vl_gguf  # noqa: E402  (beside the other fixture scripts, not a package)

QWEN = FIXTURES / "vision" / "qwen2_5_vl"
MANIFEST = json.loads((QWEN / "manifest.json").read_text())
IMAGE_TOKEN = MANIFEST["image_token_id"]
GEMMA_MMPROJ = FIXTURES / "vision" / "gemma3" / "mmproj-gemma3.gguf"
TOP = 5


@pytest.fixture(scope="module")
def refs():
    with np.load(QWEN / "references.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """The text GGUF with its mmproj beside it, as a downloaded model folder holds them."""
    return make_qwen_vl_gguf.write_pair(tmp_path_factory.mktemp("qwen-gguf"))


@pytest.fixture(scope="module")
def text_alone(pair, tmp_path_factory) -> Path:
    """The same text GGUF in a folder of its own: no mmproj to find."""
    path = tmp_path_factory.mktemp("qwen-text") / pair[0].name
    shutil.copy(pair[0], path)
    return path


@pytest.fixture(scope="module")
def engine(pair) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(pair[0]), device="cpu", max_model_len=256, block_size=4))


def _views(engine: LLMEngine, names: list[str]):
    return [engine.vision.prepare((QWEN / "images" / f"{n}.png").read_bytes()).views[0] for n in names]


def _generate(engine: LLMEngine, case: str, max_tokens: int | None = None) -> dict:
    spec = MANIFEST["cases"][case]
    n = max_tokens or len(MANIFEST["greedy"][case])
    params = SamplingParams(temperature=0.0, max_tokens=n, logprobs=TOP)
    return engine.generate([spec["token_ids"]], params, images=[_views(engine, spec["images"])])[0]


def _check(result: dict, refs: dict, case: str) -> None:
    check_top_logprobs(result["logprobs"][0].top, refs[f"logits/{case}"][-1], TOP, atol=1e-4)
    assert result["token_ids"] == MANIFEST["greedy"][case][: len(result["token_ids"])]


# -- the pair against transformers ----------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))  # one image, two images
def test_the_gguf_pair_gives_transformers_greedy_tokens_and_logprobs(engine, refs, case):
    assert engine.config.mmproj is None  # found beside the text GGUF
    assert engine.checkpoint.format == "gguf" and isinstance(engine.runner.images.vision, QwenVisionModel)
    result = _generate(engine, case)
    _check(result, refs, case)
    assert len(result["token_ids"]) == len(MANIFEST["greedy"][case])


@pytest.mark.parametrize("name", sorted(MANIFEST["grids"]))
def test_the_mmproj_tower_and_preprocessing_match_transformers(engine, refs, name):
    vision = engine.runner.images.vision
    patches, grid = preprocess_qwen(Image.open(QWEN / "images" / f"{name}.png"), vision.config)
    assert list(grid) == MANIFEST["grids"][name]
    np.testing.assert_allclose(patches, refs[f"pixels/{name}"], rtol=0, atol=1e-6)
    close_to_scale(vision.encode(refs[f"pixels/{name}"], grid), refs[f"features/{name}"])


def test_the_mmproj_says_what_the_hf_config_says(pair):
    """Every setting from clip.* keys equals the HF folder's, but for float32 storage."""
    from_gguf = load_vision(open_checkpoint(pair[0]), CpuBackend()).config
    from_hf = load_vision(open_checkpoint(QWEN / "hf"), CpuBackend()).config
    np.testing.assert_allclose(from_gguf.image_mean + from_gguf.image_std, from_hf.image_mean + from_hf.image_std,
                               rtol=1e-7)  # fmt: skip
    assert from_gguf.rms_eps == pytest.approx(from_hf.rms_eps, rel=1e-6)
    same = dataclasses.replace(
        from_gguf, image_mean=from_hf.image_mean, image_std=from_hf.image_std, rms_eps=from_hf.rms_eps
    )
    assert same == from_hf


def test_the_text_config_reads_m_rope_sections_from_the_metadata(pair):
    checkpoint = open_checkpoint(pair[0])
    assert checkpoint.architecture == "qwen2vl"
    ours = config_from_gguf(checkpoint.metadata, 300)
    hf = config_from_hf(json.loads((QWEN / "hf" / "config.json").read_text()))
    assert ours.mrope_section == (2, 3, 3)
    fields = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
              "rope_theta", "qkv_bias", "mrope_section", "vocab_size")  # fmt: skip
    assert {f: getattr(ours, f) for f in fields} == {f: getattr(hf, f) for f in fields}


# -- finding the mmproj ----------------------------------------------------------------------------


def test_a_model_folder_opens_its_gguf_with_the_mmproj_beside_it(pair, tmp_path):
    engine = LLMEngine(EngineConfig(model=str(pair[0].parent), device="cpu", max_model_len=64, block_size=4))
    assert engine.checkpoint.path == pair[0] and isinstance(engine.runner.images.vision, QwenVisionModel)
    shutil.copy(pair[1], tmp_path / pair[1].name)
    with pytest.raises(
        CheckpointError, match="an mmproj file is a vision projector: it needs its model GGUF"
    ):
        open_checkpoint(tmp_path)


def test_an_mmproj_given_with_the_option_is_used(text_alone, pair, refs):
    alone = LLMEngine(EngineConfig(model=str(text_alone), device="cpu", max_model_len=256, block_size=4))
    assert alone.vision is None  # nothing beside it
    given = LLMEngine(
        EngineConfig(
            model=str(text_alone), mmproj=str(pair[1]), device="cpu", max_model_len=256, block_size=4
        )
    )
    _check(_generate(given, "two_images", max_tokens=2), refs, "two_images")


def test_paddock_generate_takes_the_mmproj_option(text_alone, pair, capsys):
    base = ["generate", "--model", str(text_alone), "--device", "cpu", "--temperature", "0",
            "--max-tokens", "1", "--top-logprobs", "3", "--json", "--chat"]  # fmt: skip
    image = str(QWEN / "images" / "large.png")
    assert paddock([*base, "Hello"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert paddock([*base, "--image", image, "Hello"]) == 2
    assert "--image: the loaded model has no vision" in capsys.readouterr().err
    assert paddock([*base, "--mmproj", str(pair[1]), "--image", image, "Hello"]) == 0
    record = json.loads(capsys.readouterr().out)
    t, h, w = MANIFEST["grids"]["large"]
    assert record["prompt_token_ids"].count(IMAGE_TOKEN) == t * h * w // 4
    assert record["top_logprobs"][0] != plain["top_logprobs"][0]


def test_a_text_only_gguf_refuses_an_image_in_words(text_alone):
    engine = LLMEngine(EngineConfig(model=str(text_alone), device="cpu", max_model_len=256, block_size=4))
    spec = MANIFEST["cases"]["one_image"]
    t, h, w = MANIFEST["grids"]["odd_rgba"]
    image = ImageInput(np.zeros((t * h * w, 3 * 2 * 14 * 14), np.float32), grid_thw=(t, h, w))
    with pytest.raises(NoVisionError, match="the loaded model has no vision: it cannot take images"):
        engine.generate([spec["token_ids"]], SamplingParams(max_tokens=1), images=[[image]])
    # the same ids as text still run: the image tokens keep their own embeddings
    assert engine.generate([spec["token_ids"]], SamplingParams(temperature=0.0, max_tokens=1))[0]["token_ids"]


# -- what a published file holds, and what is refused ---------------------------------------------


def test_a_file_with_only_the_converters_keys_gets_llama_cpps_defaults(tmp_path):
    path = make_qwen_vl_gguf.write_mmproj(make_qwen_vl_gguf.HF, tmp_path / "mmproj.gguf", extra_keys=False)
    meta = read_gguf(path).metadata
    assert "clip.vision.window_size" not in meta and "clip.vision.image_max_pixels" not in meta
    cfg = qwen_config_from_gguf(meta, 64)
    assert cfg.window_size == 112 and cfg.window_merged == 4  # clip.cpp's window when none is stored
    assert (cfg.min_pixels, cfg.max_pixels) == (8 * 28 * 28, 4096 * 28 * 28)  # its 8..4096 image tokens
    assert cfg.fullatt_block_indexes == (1,)  # n_wa_pattern 2 over 3 layers


def test_n_wa_pattern_gives_the_full_attention_layers_as_clip_cpp_does(pair):
    meta = dict(read_gguf(pair[1]).metadata)
    # Qwen2.5-VL-7B: 32 layers, fullatt_block_indexes [7, 15, 23, 31], stored as 8
    cfg = qwen_config_from_gguf({**meta, "clip.vision.block_count": 32, "clip.vision.n_wa_pattern": 8}, 64)
    assert cfg.fullatt_block_indexes == (7, 15, 23, 31)
    no_windows = qwen_config_from_gguf({**meta, "clip.vision.n_wa_pattern": 0}, 64)
    assert no_windows.fullatt_block_indexes == (0, 1, 2)


@pytest.mark.parametrize(("kind", "rel"), [("F16", 2e-3), ("Q8_0", 2e-2)])  # measured: 5e-4, 1e-2
def test_a_quantized_mmproj_keeps_its_format_and_nearly_the_same_features(tmp_path, refs, kind, rel):
    path = make_qwen_vl_gguf.write_mmproj(make_qwen_vl_gguf.HF, tmp_path / "mmproj.gguf", mmproj_type=kind)
    text = make_qwen_vl_gguf.write_text_gguf(make_qwen_vl_gguf.HF, tmp_path / "text.gguf")
    vision = load_vision(open_checkpoint(text), CpuBackend(), mmproj=path)
    tensors = tower_tensors(dict(read_gguf(path).tensors), vision.config)
    qkv = tensors["blocks.0.attn.qkv.weight"]
    assert qkv.qtype.name == kind and qkv.shape == (96, 32)  # q, k, v rows joined as stored
    # the joined rows read back as gguf-py reads the three stored tensors
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}
    parts = [gguf.quants.dequantize(stored[f"v.blk.0.attn_{p}.weight"].data, stored[f"v.blk.0.attn_{p}.weight"].tensor_type)
             for p in "qkv"]  # fmt: skip
    np.testing.assert_array_equal(qkv.dequantize(), np.concatenate(parts))
    grid = tuple(MANIFEST["grids"]["wide"])
    close_to_scale(vision.encode(refs["pixels/wide"], grid), refs["features/wide"], rel)


def test_up_and_down_stored_under_each_others_names_are_swapped_back(pair, refs):
    """Old conversions named each block's MLP up projection ffn_down and the reverse (clip.cpp swaps
    them back): the tower built from such names gives transformers' features."""
    file = read_gguf(pair[1])
    swapped = {}
    for name, tensor in file.tensors.items():
        swapped[name.replace("ffn_up", "TMP").replace("ffn_down", "ffn_up").replace("TMP", "ffn_down")] = (
            tensor
        )
    cfg = qwen_config_from_gguf(file.metadata, 64)
    model = QwenVisionModel(CpuBackend(), cfg, tower_tensors(swapped, cfg))
    close_to_scale(model.encode(refs["pixels/tall"], tuple(MANIFEST["grids"]["tall"])), refs["features/tall"])


def test_other_projectors_and_m_rope_layouts_are_refused_in_words(pair, text_alone):
    meta = dict(read_gguf(pair[1]).metadata)
    with pytest.raises(CheckpointError, match=r"'qwen2vl_merger' is Qwen2-VL's .* not supported"):
        qwen_config_from_gguf({**meta, "clip.projector_type": "qwen2vl_merger"}, 64)
    with pytest.raises(CheckpointError, match=r"lacks clip\.use_silu"):
        qwen_config_from_gguf({k: v for k, v in meta.items() if k != "clip.use_silu"}, 64)
    with pytest.raises(CheckpointError, match="projection_dim is 64, the text model's hidden size 128"):
        qwen_config_from_gguf(meta, 128)
    # Gemma 3's mmproj beside a Qwen text model
    with pytest.raises(CheckpointError, match=r"mmproj-gemma3.gguf: .*'gemma3' is not Qwen2.5-VL's"):
        LLMEngine(
            EngineConfig(model=str(text_alone), mmproj=str(GEMMA_MMPROJ), device="cpu", max_model_len=64)
        )
    text = dict(read_gguf(text_alone).metadata)
    with pytest.raises(CheckpointError, match="a fourth M-RoPE section is not supported"):
        config_from_gguf({**text, "qwen2vl.rope.dimension_sections": [2, 2, 2, 2]}, 300)
    with pytest.raises(CheckpointError, match=r"metadata has no qwen2vl\.rope\.dimension_sections"):
        config_from_gguf({k: v for k, v in text.items() if "dimension_sections" not in k}, 300)
    with pytest.raises(CheckpointError, match=r"sums to 9, not half the head size 16"):
        config_from_gguf({**text, "qwen2vl.rope.dimension_sections": [3, 3, 3, 0]}, 300)


def test_a_truncated_mmproj_tensor_set_is_named(pair):
    file = read_gguf(pair[1])
    cfg = qwen_config_from_gguf(file.metadata, 64)
    tensors = {k: v for k, v in file.tensors.items() if k != "v.blk.2.attn_k.weight"}
    with pytest.raises(CheckpointError, match=r"v.blk.2: the mmproj has \['attn_q', 'attn_v'\]"):
        tower_tensors(tensors, cfg)
    tensors = {k: v for k, v in file.tensors.items() if k != "v.patch_embd.weight.1"}
    with pytest.raises(CheckpointError, match="two temporal halves"):
        tower_tensors(tensors, cfg)
    with pytest.raises(CheckpointError, match=r"tensors a Qwen2\.5-VL tower has not: v\.pre_ln\.weight"):
        tower_tensors({**file.tensors, "v.pre_ln.weight": file.tensors["v.post_ln.weight"]}, cfg)


# -- will it fit ---------------------------------------------------------------------------------


def test_will_it_fit_counts_the_tower_from_the_mmproj(pair, text_alone):
    reader = gguf.GGUFReader(pair[1])
    mmproj_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    text_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(pair[0]).tensors)
    shape = shape_from_checkpoint(pair[0])
    assert shape.weight_bytes == text_bytes  # the text GGUF's tensors, the tower apart
    assert shape.vision is not None and shape.vision.weight_bytes == mmproj_bytes
    assert shape.vision.source == pair[1].name
    assert (shape.vision.hidden_size, shape.vision.num_heads, shape.vision.intermediate_size) == (32, 4, 48)
    assert shape_from_checkpoint(text_alone).vision is None


def largest_image_patches(processor: dict) -> int:
    """The patches of the largest image Qwen2VLImageProcessor lets through (its longest_edge is pixels)."""
    return processor["size"]["longest_edge"] // processor["patch_size"] ** 2


def test_will_it_fit_sizes_the_tower_at_its_largest_image(pair):
    """Not at the converter's placeholder image_size: Qwen's full-attention layers see every patch of
    an image up to max_pixels, one head's scores at a time."""
    processor = json.loads((QWEN / "hf" / "preprocessor_config.json").read_text())
    patches = largest_image_patches(processor)
    for vision in (shape_from_checkpoint(pair[0]).vision, shape_from_checkpoint(QWEN / "hf").vision):
        assert vision is not None and vision.patches == patches == 64
        assert vision.activation_bytes() == (patches**2 + patches * (6 * 32 + 2 * 48)) * 4


def test_will_it_fit_counts_a_hf_folders_visual_tensors_apart(pair):
    from safetensors import safe_open

    with safe_open(str(QWEN / "hf" / "model.safetensors"), "np") as file:
        names = list(file.keys())
        visual = sum(file.get_tensor(n).nbytes for n in names if n.removeprefix("model.").startswith("visual."))
        total = sum(file.get_tensor(n).nbytes for n in names)
    shape = shape_from_checkpoint(QWEN / "hf")
    assert visual > 0 and shape.vision is not None and shape.vision.weight_bytes == visual
    assert (shape.vision.hidden_size, shape.vision.num_heads, shape.vision.intermediate_size) == (32, 4, 48)
    assert shape.weight_bytes <= total - visual

