"""Will-it-fit counts the vision tower: the mmproj GGUF beside a text GGUF (found as the loader finds
it) or the vision tensors of a Hugging Face folder, itemized as a "vision" line. The expected bytes
come from the files themselves through gguf-py's reader and the raw safetensors headers."""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from app.cli import main as paddock
from app.engine.plan.device import GiB
from app.engine.plan.fit import DeviceMemory, FitOptions, check_fit, shape_from_checkpoint
from app.engine.plan.memory import memory
from app.engine.plan.vision_fit import VisionShape

FIXTURES = Path(__file__).parents[1] / "fixtures"
HF = FIXTURES / "vision" / "gemma3" / "hf"
MMPROJ = FIXTURES / "vision" / "gemma3" / "mmproj-gemma3.gguf"
GEMMA_GGUF = FIXTURES / "families" / "gemma3" / "gemma3-f16.gguf"
LLAMA_GGUF = FIXTURES / "families" / "llama" / "llama-bf16-q8_0.gguf"


def gguf_tensor_bytes(path: Path) -> int:
    import gguf

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)


def safetensors_bytes(path: Path, prefixes: tuple[str, ...]) -> int:
    with open(path, "rb") as stream:
        (size,) = struct.unpack("<Q", stream.read(8))
        header = json.loads(stream.read(size))
    return sum(t["data_offsets"][1] - t["data_offsets"][0] for name, t in header.items()
               if name != "__metadata__" and name.removeprefix("model.").startswith(prefixes))


@pytest.fixture
def gemma_with_mmproj(tmp_path) -> Path:
    folder = tmp_path / "gemma"
    folder.mkdir()
    shutil.copy(GEMMA_GGUF, folder / "gemma3-f16.gguf")
    shutil.copy(MMPROJ, folder / "mmproj-gemma3-f16.gguf")
    return folder / "gemma3-f16.gguf"


def test_the_mmproj_beside_a_gguf_is_counted(gemma_with_mmproj):
    shape = shape_from_checkpoint(gemma_with_mmproj)
    alone = shape_from_checkpoint(GEMMA_GGUF)  # the fixture's own folder holds no mmproj
    assert alone.vision is None and shape.weight_bytes == alone.weight_bytes
    assert shape.vision == VisionShape(gguf_tensor_bytes(MMPROJ), image_size=56, patch_size=7, hidden_size=32,
                                       num_heads=4, intermediate_size=48, source="mmproj-gemma3-f16.gguf")
    options = FitOptions(context_length=256)
    with_vision, without = memory(shape, options, "cuda"), memory(alone, options, "cuda")
    patches = (56 // 7) ** 2
    # one head's scores at a time, softmaxed in place (siglip.full_attention), and one layer's activations
    encode = (patches**2 + patches * (6 * 32 + 2 * 48)) * 4
    assert with_vision.vision_weights == gguf_tensor_bytes(MMPROJ)
    assert with_vision.vision_activations == encode
    assert with_vision.total - without.total == gguf_tensor_bytes(MMPROJ) + encode


def test_a_hf_folders_vision_tensors_are_counted_apart_from_the_text_weights():
    shape = shape_from_checkpoint(HF)
    vision = safetensors_bytes(HF / "model.safetensors", ("vision_tower.", "multi_modal_projector."))
    text = safetensors_bytes(HF / "model.safetensors", ("language_model.",))
    assert vision > 0 and shape.vision.weight_bytes == vision
    assert shape.weight_bytes == text  # the text side alone: the vision tensors are not counted twice
    assert (shape.vision.image_size, shape.vision.patch_size, shape.vision.num_heads) == (56, 7, 4)


def test_a_text_only_family_ignores_an_mmproj_beside_it(tmp_path):
    shutil.copy(LLAMA_GGUF, tmp_path / "llama.gguf")
    shutil.copy(MMPROJ, tmp_path / "mmproj-x.gguf")
    assert shape_from_checkpoint(tmp_path / "llama.gguf").vision is None  # as the loader: llama takes no images


def test_paddock_fit_shows_a_vision_line(gemma_with_mmproj, capsys):
    assert paddock(["fit", str(gemma_with_mmproj), "--ctx", "256"]) == 0
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if line.strip().startswith("vision")]
    assert "in mmproj-gemma3-f16.gguf" in line and "to encode an image" in line
    assert paddock(["fit", str(gemma_with_mmproj), "--ctx", "256", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["shape"]["vision"]["source"] == "mmproj-gemma3-f16.gguf"
    assert report["breakdown"]["vision_weights"] == gguf_tensor_bytes(MMPROJ)
    assert report["breakdown"]["vision"] == report["breakdown"]["vision_weights"] + report["breakdown"][
        "vision_activations"]
    assert paddock(["fit", str(GEMMA_GGUF), "--ctx", "256"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if line.strip().startswith("vision")]  # a text-only model has no such line


def test_two_mmproj_files_are_an_error_naming_them(gemma_with_mmproj, capsys):
    shutil.copy(MMPROJ, gemma_with_mmproj.parent / "mmproj-other.gguf")
    assert paddock(["fit", str(gemma_with_mmproj)]) == 2
    err = capsys.readouterr().err
    assert "several mmproj files" in err and "mmproj-other.gguf" in err


def test_the_tower_takes_room_from_the_largest_context(gemma_with_mmproj):
    shape = shape_from_checkpoint(gemma_with_mmproj)
    big = VisionShape(2 * GiB, 896, 14, 1152, 16, 4304, "mmproj-big.gguf")  # Gemma 3's SigLIP at f16
    device = DeviceMemory("cuda", "Test GPU", 3 * GiB, 8 * GiB)
    options = FitOptions(kv_dtype="float16")
    plain = check_fit(replace(shape, vision=None), options, device)
    tower = check_fit(replace(shape, vision=big), options, device)
    # one head's 4096 x 4096 scores at a time (siglip.full_attention), beside one layer's activations
    assert tower.breakdown.vision_activations == (4096**2 + 4096 * (6 * 1152 + 2 * 4304)) * 4
    assert tower.breakdown.total == plain.breakdown.total + tower.breakdown.vision
    assert "vision" in tower.summary() and "mmproj-big.gguf" in tower.summary()
    assert tower.max_context < plain.max_context  # the tower and its image leave no room here


def test_the_library_lists_a_hf_vision_folder_as_taking_images(tmp_path):
    from app.studio.library import ModelLibrary

    shutil.copytree(HF, tmp_path / "acme" / "gemma-vision")
    [entry] = ModelLibrary(tmp_path).list()
    assert entry.takes_images and entry.vision == "gemma-vision/*.safetensors"
    local = shape_from_checkpoint(entry.path)
    # the library's header-only reading splits the tensors as the loader does
    assert entry.shape.weight_bytes == local.weight_bytes and entry.shape.vision == local.vision
