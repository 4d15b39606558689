"""Will-it-fit counts Gemma 4's audio tower: the `audio_tower.*` / `embed_audio.*` tensors of a Hugging
Face folder with an audio_config (tests/fixtures/gemma4_audio), apart from the text weights, itemized as
an "audio" line; its working set to encode the longest clip (30 s) is what the tower allocates, measured
with tracemalloc. Expected bytes come from the raw safetensors header."""

from __future__ import annotations

import json
import struct
import sys
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np

from app.cli import main as paddock
from app.engine.plan.device import GiB
from app.engine.plan.fit import DeviceMemory, FitOptions, check_fit, shape_from_checkpoint

FIXTURES = Path(__file__).parents[1] / "fixtures"
HF = FIXTURES / "gemma4_audio" / "hf"
ENGINE_TESTS = Path(__file__).parents[1] / "engine"
sys.path.insert(0, str(ENGINE_TESTS))  # gemma4_gguf: a Gemma 4 GGUF written as llama.cpp's converter does
sys.path.insert(0, str(ENGINE_TESTS / "audio"))  # gemma4_audio_mmproj: its audio mmproj likewise
from gemma4_audio_mmproj import write_audio_mmproj  # noqa: E402
from gemma4_gguf import write_gguf  # noqa: E402


def stored_bytes(prefixes: tuple[str, ...]) -> int:
    """The fixture's tensors under these prefixes, from the raw safetensors header."""
    with open(HF / "model.safetensors", "rb") as stream:
        (size,) = struct.unpack("<Q", stream.read(8))
        header = json.loads(stream.read(size))
    found = [t["data_offsets"] for name, t in header.items() if name.removeprefix("model.").startswith(prefixes)]
    return sum(end - start for start, end in found)


def test_the_audio_tensors_are_counted_apart_from_the_text_weights():
    shape = shape_from_checkpoint(HF)
    audio, text = stored_bytes(("audio_tower.", "embed_audio.")), stored_bytes(("language_model.",))
    assert audio > 0 and shape.audio.weight_bytes == audio
    assert shape.weight_bytes == text  # the text side alone: the audio tensors are not counted twice
    assert shape.vision is None  # vision_config is null: no tower to count
    assert shape_from_checkpoint(FIXTURES / "gemma4_vision" / "hf").audio is None


def test_the_working_set_is_what_encoding_a_30_s_clip_allocates():
    from app.engine.backend.cpu import CpuBackend
    from app.engine.models.audio import load_gemma4_audio_tower
    from app.engine.models.audio.gemma4_audio_features import gemma4_log_mel

    tower = load_gemma4_audio_tower(HF, json.loads((HF / "config.json").read_text()), CpuBackend())
    noise = np.random.default_rng(0).standard_normal(480_000).astype(np.float32) * 0.1
    mel = gemma4_log_mel(noise, tower.config.mel)
    tracemalloc.start()
    try:
        tower.encode(mel)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    predicted = shape_from_checkpoint(HF).audio.activation_bytes
    assert 0.85 * predicted < peak < 1.15 * predicted


def test_the_tower_is_in_the_total_and_the_summary(capsys):
    shape = shape_from_checkpoint(HF)
    device = DeviceMemory("cuda", "Test GPU", 1 * GiB, 8 * GiB)
    options = FitOptions(context_length=256)
    with_audio, without = check_fit(shape, options, device), check_fit(replace(shape, audio=None), options, device)
    b = with_audio.breakdown
    assert b.audio_weights == shape.audio.weight_bytes and b.audio_activations == shape.audio.activation_bytes
    assert b.total - without.breakdown.total == b.audio
    assert with_audio.max_context <= without.max_context
    assert paddock(["fit", str(HF), "--ctx", "256"]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("audio")]
    assert "in hf/*.safetensors" in line and "to encode a 30 s clip" in line
    assert paddock(["fit", str(HF), "--ctx", "256", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["breakdown"]["audio_weights"] == shape.audio.weight_bytes
    assert report["breakdown"]["audio"] == b.audio and report["audio_source"] == "Gemma 4 in hf/*.safetensors"



def test_the_library_splits_the_audio_tensors_as_the_engine_does(tmp_path):
    import shutil

    from app.studio.library import ModelLibrary

    shutil.copytree(HF, tmp_path / "acme" / "gemma4-audio")
    [entry] = ModelLibrary(tmp_path).list()
    local = shape_from_checkpoint(entry.path)
    # the header-only reading: the audio tensors apart, no vision tower for a null vision_config
    assert entry.shape.audio == local.audio and entry.shape.weight_bytes == local.weight_bytes
    assert entry.shape.vision is None and not entry.takes_images


def test_an_audio_mmproj_beside_a_gemma4_gguf_is_counted_as_audio(tmp_path):
    model = tmp_path / "gemma4-dense.gguf"
    write_gguf(FIXTURES / "gemma4" / "dense", model)
    alone = shape_from_checkpoint(model)
    write_audio_mmproj(HF, tmp_path / "mmproj-gemma4-audio.gguf")
    shape = shape_from_checkpoint(model)
    assert alone.audio is None and shape.vision is None  # an audio-only mmproj is no vision tower
    assert shape.audio.source == "mmproj-gemma4-audio.gguf" and shape.weight_bytes == alone.weight_bytes
    # the mmproj's tensors are the HF folder's audio tensors, F32 either way: the same bytes
    assert shape.audio.weight_bytes == shape_from_checkpoint(HF).audio.weight_bytes
    assert shape.audio.activation_bytes == shape_from_checkpoint(HF).audio.activation_bytes


def test_the_library_counts_the_audio_mmproj_beside_a_gemma4_gguf(tmp_path):
    """The Models pane's entry holds what shape_from_checkpoint counts: the audio half beside the GGUF, no
    vision tower from an audio-only mmproj, and a job that says it takes audio."""
    from app.studio.library import ModelLibrary

    model = tmp_path / "gemma4-dense.gguf"
    write_gguf(FIXTURES / "gemma4" / "dense", model)
    [alone] = ModelLibrary(tmp_path).list()
    assert alone.shape.audio is None and alone.job == "chat"
    write_audio_mmproj(HF, tmp_path / "mmproj-gemma4-audio.gguf")
    [entry] = ModelLibrary(tmp_path).list()
    assert entry.error is None and not entry.takes_images and entry.job == "chat + audio"
    assert entry.shape.audio == shape_from_checkpoint(model).audio
