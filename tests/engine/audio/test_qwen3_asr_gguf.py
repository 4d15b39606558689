"""Qwen3-ASR from llama.cpp's pair: a `qwen3vl` text GGUF and a `qwen3a` audio mmproj.

The pair is written at test time, with gguf-py, from the tiny Qwen3-ASR fixture the way llama.cpp's
convert_hf_to_gguf.py writes it (tests/qwen3_asr_pair.py says how). The mmproj holds no attention window,
so the loader takes transformers' default 800 frames: the folder's encoder is compared under that window
and with the same F16-rounded convolution weights. Transformers' greedy tokens come out the same.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from qwen3_asr_pair import CONFIG, HF, MMPROJ_NAME, write_mmproj, write_pair
from speech_fixtures import CLIP, FIXTURES, clip_samples, references

from app.engine.loader.names import CheckpointError
from app.engine.models.audio import Qwen3AsrAudioEncoder, load_mmproj_audio_encoder
from app.engine.models.audio.qwen3_asr_config import qwen3_asr_audio_config
from app.engine.models.audio.qwen3_asr_mmproj import N_WINDOW_INFER
from app.engine.models.audio.qwen3_asr_weights import load_qwen3_asr_audio
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import quant_type
from app.engine.tasks.speech_llm import SpeechLLMTranscriber

MANIFEST = json.loads((FIXTURES / "qwen3_asr" / "manifest.json").read_text())
CLIPS = sorted(MANIFEST["samples"])


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    return write_pair(tmp_path_factory.mktemp("qwen3_asr_gguf"))


@pytest.fixture(scope="module")
def from_gguf(pair) -> SpeechLLMTranscriber:
    return SpeechLLMTranscriber.load(pair, device="cpu")


@pytest.fixture(scope="module")
def refs() -> dict[str, np.ndarray]:
    return references("qwen3_asr")


def _folder_encoder_as_the_file_says(backend) -> Qwen3AsrAudioEncoder:
    """The folder's encoder under the mmproj's window, its convolution weights F16-rounded as the converter's."""
    cfg = dataclasses.replace(qwen3_asr_audio_config(HF, CONFIG), n_window_infer=N_WINDOW_INFER)
    tensors = load_qwen3_asr_audio(HF, cfg)
    for name in [n for n in tensors if n.startswith("tower.conv") and n.endswith(".weight")]:
        rounded = tensors[name].dequantize().astype(np.float16).astype(np.float32)
        tensors[name] = QuantizedTensor.from_float(name, rounded, quant_type("F32"))
    return Qwen3AsrAudioEncoder(backend, cfg, tensors)


@pytest.mark.parametrize("clip", CLIPS)
def test_the_pair_encodes_as_the_folder(clip, refs, from_gguf):
    encoder = from_gguf.task.engine.runner.images.vision
    assert isinstance(encoder, Qwen3AsrAudioEncoder)
    assert encoder.config.audio_token_id == MANIFEST["audio_token_id"]
    folder = _folder_encoder_as_the_file_says(from_gguf.task.engine.backend)
    mel = refs[f"mel/{clip}"][:, : int(refs[f"mask/{clip}"].sum())]
    np.testing.assert_allclose(encoder.encoder_states(mel), folder.encoder_states(mel), atol=1e-5, rtol=0)
    np.testing.assert_allclose(encoder.encode(mel), folder.encode(mel), atol=1e-5, rtol=0)
    if mel.shape[1] <= qwen3_asr_audio_config(HF, CONFIG).n_window_infer:  # one window: transformers' own,
        np.testing.assert_allclose(
            encoder.encode(mel), refs[f"features/{clip}"], atol=2e-3, rtol=0
        )  # F16 convs


@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))
def test_the_pair_gives_transformers_tokens(case, from_gguf):
    expected = MANIFEST["cases"][case]
    samples = clip_samples(MANIFEST)[expected["clip"]]
    ids, reply = from_gguf.reply_ids(samples, expected["language"], min_tokens=len(expected["greedy"]))
    assert ids == expected["token_ids"]
    # transformers ran exactly that many tokens; the file names no reply limit, so the run may go on
    assert reply[: len(expected["greedy"])] == expected["greedy"]


@pytest.mark.parametrize("cut", [5_000, -100])  # inside the tensor table; inside the last tensor's data
def test_a_truncated_mmproj_is_refused_naming_it_and_the_tensor(cut, pair, tmp_path):
    shutil.copy(pair, tmp_path)
    mmproj = tmp_path / MMPROJ_NAME
    mmproj.write_bytes((pair.parent / MMPROJ_NAME).read_bytes()[:cut])
    with pytest.raises(CheckpointError, match=rf"ASR model .*{MMPROJ_NAME}: .*tensor 'a\.[\w.]+'"):
        SpeechLLMTranscriber.load(tmp_path / pair.name, device="cpu")


BROKEN = {  # how write_mmproj breaks the file -> what the error says after the file's name
    "missing": ({"drop": "a.blk.1.ffn_down.weight"}, r"lacks a\.blk\.1\.ffn_down\.weight"),
    "wrong-shape": (
        {"replace": {"a.blk.0.attn_q.weight": np.zeros((32, 16), np.float32)}},
        r"a\.blk\.0\.attn_q\.weight has shape \[32, 16\], the clip\.audio\.\* keys need \[32, 32\]",
    ),
    "unknown": (
        {"replace": {"a.blk.0.attn_qkv.weight": np.zeros((96, 32), np.float32)}},
        r"tensor 'a\.blk\.0\.attn_qkv\.weight' is not one of Qwen3-ASR's",
    ),
    "wrong-kind": (
        {"projector": "qwen2a"},
        r"clip\.projector_type is 'qwen2a', not 'granite_speech' .*'qwen3a'",
    ),
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_broken_mmproj_is_refused_naming_it_and_the_tensor_or_key(broken, pair, tmp_path, from_gguf):
    how, problem = BROKEN[broken]
    write_mmproj(tmp_path / MMPROJ_NAME, **how)
    engine = from_gguf.task.engine
    with pytest.raises(CheckpointError, match=re.escape(f"{tmp_path / MMPROJ_NAME}: ") + problem):
        load_mmproj_audio_encoder(tmp_path / pair.name, engine.model_config, engine.tokenizer, engine.backend)


def test_will_it_fit_counts_the_mmproj_as_audio(pair, from_gguf):
    from app.engine.models.audio.qwen3_asr_mmproj import qwen3_asr_from_mmproj
    from app.engine.plan.fit import FitOptions, check_fit, shape_from_checkpoint

    shape = shape_from_checkpoint(pair)
    assert shape.vision is None and shape.audio is not None
    assert shape.audio.source == MMPROJ_NAME and shape.audio.family == "Qwen3-ASR"
    _, held = qwen3_asr_from_mmproj(
        pair.parent / MMPROJ_NAME, MANIFEST["audio_token_id"]
    )  # what the encoder holds
    assert shape.audio.weight_bytes == sum(t.nbytes for t in held.values())
    assert shape.weight_bytes == sum(t.nbytes for t in from_gguf.task.engine.checkpoint.tensors.values())
    # the working set from the header's sizes: the folder's encoder under the mmproj's assumed window
    from app.engine.plan.audio_fit import ASR_CONTEXT, qwen3_asr_activation_bytes

    folder_cfg = dataclasses.replace(qwen3_asr_audio_config(HF, CONFIG), n_window_infer=N_WINDOW_INFER)
    assert shape.audio.activation_bytes == qwen3_asr_activation_bytes(folder_cfg, ASR_CONTEXT) > 0
    assert shape.audio.clip == f"clip of {ASR_CONTEXT:,} tokens"
    report = check_fit(shape, FitOptions())
    assert report.breakdown.audio == shape.audio.total and "audio" in report.summary()


@pytest.mark.parametrize("given", ["file", "folder"])  # the text GGUF, or the folder holding the pair
def test_transcribe_command_runs_the_pair(given, pair, tmp_path, from_gguf):
    from app.cli import main

    out = tmp_path / "speech.json"
    model = pair if given == "file" else pair.parent
    args = ["transcribe", str(CLIP), "--model", str(model), "--device", "cpu", "--language", "en"]
    assert main([*args, "--format", "json", "--output", str(out)]) == 0
    text = json.loads(out.read_text())["text"]
    greedy = MANIFEST["cases"]["speech/English"][
        "greedy"
    ]  # the reply runs on past it: the file sets no limit
    assert text.startswith(from_gguf.task.engine.tokenizer.decode(greedy, skip_special_tokens=True).strip())


def test_serve_refuses_a_pair_with_a_broken_mmproj_naming_the_file(pair, tmp_path, capsys):
    from app.cli import main

    shutil.copy(pair, tmp_path)
    write_mmproj(tmp_path / MMPROJ_NAME, drop="mm.a.mlp.2.weight")
    chat = str(FIXTURES / "families" / "qwen3" / "qwen3-kquants.gguf")
    args = ["serve", "--model", chat, "--device", "cpu", "--port", "0", "--no-mcp", "--no-embeddings"]
    assert main([*args, "--asr-model", str(tmp_path / pair.name)]) == 2
    assert f"{tmp_path / MMPROJ_NAME}: lacks mm.a.mlp.2.weight" in capsys.readouterr().err


# -- the converter's own mmproj (tests/fixtures/make_qwen3_asr_mmproj.py ran llama.cpp's convert_hf_to_gguf.py) --

CONVERTED = FIXTURES / "qwen3_asr" / "gguf" / MMPROJ_NAME


def test_the_writer_writes_what_the_converter_writes(pair):
    from app.engine.loader.gguf import read_gguf

    ours, theirs = read_gguf(pair.parent / MMPROJ_NAME), read_gguf(CONVERTED)
    assert sorted(ours.tensors) == sorted(theirs.tensors)
    for name, tensor in theirs.tensors.items():
        mine = ours.tensors[name]
        assert (mine.qtype.name, mine.shape) == (tensor.qtype.name, tensor.shape), name
        if name == "a.position_embd.weight":  # sinusoids: torch's float32 sin and numpy's differ in ulps
            np.testing.assert_allclose(mine.dequantize(), tensor.dequantize(), atol=1e-4, rtol=0)
        else:
            assert np.array_equal(mine.data, tensor.data), name
    clip = {k: v for k, v in theirs.metadata.items() if k.startswith("clip.")}
    assert clip == {k: v for k, v in ours.metadata.items() if k.startswith("clip.")}


def test_the_converters_mmproj_encodes_as_the_folder(refs, from_gguf):
    from app.engine.models.audio.qwen3_asr_mmproj import qwen3_asr_from_mmproj

    cfg, tensors = qwen3_asr_from_mmproj(CONVERTED, MANIFEST["audio_token_id"])
    encoder = Qwen3AsrAudioEncoder(from_gguf.task.engine.backend, cfg, tensors)
    folder = _folder_encoder_as_the_file_says(from_gguf.task.engine.backend)
    mel = refs["mel/speech"][:, : int(refs["mask/speech"].sum())]
    np.testing.assert_allclose(encoder.encode(mel), folder.encode(mel), atol=1e-5, rtol=0)
