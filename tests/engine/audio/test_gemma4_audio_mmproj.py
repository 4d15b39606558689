"""Gemma 4's audio tower from llama.cpp's mmproj GGUF: the tiny fixture's tower written as llama.cpp's
converter writes it (gemma4_audio_mmproj.py beside this file, with gguf-py's own tensor map), read back
under our names, gives transformers' soft tokens; a missing tensor is named with its file; a Gemma 4
GGUF with the mmproj beside it gets the tower and the audio prompter (and no vision tower)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from gemma4_audio_mmproj import write_audio_mmproj

from app.engine.backend.cpu import CpuBackend
from app.engine.core.audio import attach_audio
from app.engine.core.vision import attach_vision
from app.engine.loader.names import CheckpointError
from app.engine.loader.tokenizer import Tokenizer
from app.engine.models.audio.gemma4_audio import Gemma4AudioTower
from app.engine.models.audio.gemma4_audio_config import expected_shapes, gemma4_audio_config
from app.engine.models.audio.gemma4_audio_mmproj import gguf_name, load_gemma4_audio_mmproj
from app.engine.models.audio.gemma4_audio_prompter import Gemma4AudioPrompter

FIXTURES = Path(__file__).parents[2] / "fixtures" / "gemma4_audio"
HF = FIXTURES / "hf"
IDS = {"<|audio|>": 266, "<|audio>": 264, "<audio|>": 265}


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "mmproj-gemma4-audio.gguf"
    write_audio_mmproj(HF, path)
    return path


def test_our_names_are_the_converters(tmp_path):
    """Every tensor the tower reads, under the name gguf-py's map gives the converter's renamed HF name."""
    cfg = gemma4_audio_config(HF, json.loads((HF / "config.json").read_text()))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, cfg.num_layers)
    for ours in expected_shapes(cfg):
        hf = ours.replace("tower.", "conformer.", 1).replace("embedder.", "model.embed_audio.", 1)
        hf = hf.replace(".linear.", ".") + (".weight" if hf.endswith("per_dim_scale") else "")
        suffixes = (".weight", ".bias", ".input_max", ".input_min", ".output_max", ".output_min")
        assert gguf_name(ours) == names.get_name(hf, try_suffixes=suffixes), ours


def test_the_mmproj_tower_gives_transformers_soft_tokens(mmproj):
    cfg, tensors = load_gemma4_audio_mmproj(mmproj, IDS)
    assert (cfg.hidden_size, cfg.num_layers, cfg.conv_channels, cfg.output_dim) == (32, 2, (128, 8), 24)
    assert cfg.clipped_linears and cfg.audio_token_id == 266
    tower = Gemma4AudioTower(CpuBackend(), cfg, tensors)
    with np.load(FIXTURES / "references.npz") as refs:
        for clip in ("speech", "short"):
            mel = refs[f"mel/{clip}"][refs[f"mask/{clip}"].astype(bool)]
            np.testing.assert_allclose(np.asarray(tower.encode(mel)), refs[f"embedded/{clip}"], atol=1e-4, rtol=0)


def test_a_missing_tensor_is_named_with_its_file(tmp_path):
    path = tmp_path / "mmproj.gguf"
    write_audio_mmproj(HF, path, drop="a.blk.1.attn_k_rel.weight")
    with pytest.raises(CheckpointError, match=rf"{path}: the Gemma 4 audio tower lacks a\.blk\.1\.attn_k_rel\.weight"):
        load_gemma4_audio_mmproj(path, IDS)


def test_a_tensor_of_another_shape_is_named_with_its_file(tmp_path):
    path = tmp_path / "mmproj.gguf"
    write_audio_mmproj(HF, path, replace={"a.blk.0.attn_q.weight": np.zeros((32, 16), np.float32)})
    with pytest.raises(
        CheckpointError, match=rf"{path}: a\.blk\.0\.attn_q\.weight has shape \[32, 16\], the config needs \[32, 32\]"
    ):
        load_gemma4_audio_mmproj(path, IDS)


def test_a_gemma4_gguf_gets_the_audio_mmproj_beside_it(mmproj, tmp_path):
    shutil.copy(mmproj, tmp_path / mmproj.name)
    tokenizer = Tokenizer.from_pretrained_dir(HF)  # the text GGUF's would hold the same audio tokens
    embedding = SimpleNamespace(shape=(280, 48))
    checkpoint = SimpleNamespace(format="gguf", architecture="gemma4", path=tmp_path / "model.gguf",
                                 hf_config=None, tensors={"token_embd.weight": embedding})  # fmt: skip
    runner = SimpleNamespace(backend=CpuBackend(), images=None)
    # the engine asks the vision loader first: an audio-only mmproj is no vision tower, and no error
    assert attach_vision(runner, checkpoint, tokenizer, None) is None and runner.images is None
    prompter = attach_audio(runner, checkpoint, tokenizer)
    assert isinstance(prompter, Gemma4AudioPrompter) and prompter.image_token_id == 266
    assert isinstance(runner.images.vision, Gemma4AudioTower)
    llama = SimpleNamespace(**{**vars(checkpoint), "architecture": "llama"})
    assert attach_audio(SimpleNamespace(backend=CpuBackend(), images=None), llama, tokenizer) is None
