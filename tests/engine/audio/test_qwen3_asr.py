"""Qwen3-ASR on the numpy backend against Hugging Face transformers.

tests/fixtures/make_qwen3_asr_reference.py (run in .venv-ref; this test never imports torch) built
a tiny random-weight Qwen3ASRForConditionalGeneration and stored, for the spoken clip
tests/fixtures/audio/speech.wav (espeak-ng) and for its first 0.3 s, the feature extractor's log-mel
and frame mask, the audio tower's output and the projected audio embeddings, the prompt ids (with
and without a forced language) and transformers' greedy tokens.

Tolerances: the log-mel and the encoder are float32 computations in another order (numpy's FFT, an
erf good to 1.5e-7): within 1e-4. Greedy tokens must be equal.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from speech_fixtures import CLIP, FIXTURES, clip_samples, references

from app.engine.loader.names import CheckpointError
from app.engine.models.audio import load_audio_encoder
from app.engine.models.audio.mel import log_mel
from app.engine.models.audio.qwen3_asr import attention_windows
from app.engine.tasks.audio import AudioError
from app.engine.tasks.speech_llm import SpeechLLMTranscriber

HF = FIXTURES / "qwen3_asr" / "hf"
MANIFEST = json.loads((FIXTURES / "qwen3_asr" / "manifest.json").read_text())
CLIPS = sorted(MANIFEST["samples"])


@pytest.fixture(scope="module")
def refs() -> dict[str, np.ndarray]:
    return references("qwen3_asr")


@pytest.fixture(scope="module")
def samples() -> dict[str, np.ndarray]:
    return clip_samples(MANIFEST)


@pytest.fixture(scope="module")
def transcriber() -> SpeechLLMTranscriber:
    return SpeechLLMTranscriber.load(HF, device="cpu")


@pytest.mark.parametrize("clip", CLIPS)
def test_log_mel_matches_the_feature_extractor(clip, refs, samples):
    mel = log_mel(samples[clip])
    frames = int(refs[f"mask/{clip}"].sum())
    assert mel.shape == (128, frames)
    np.testing.assert_allclose(mel, refs[f"mel/{clip}"][:, :frames], atol=1e-4, rtol=0)
    assert not refs[f"mel/{clip}"][:, frames:].any()  # the rest is the chunk padding the encoder adds


@pytest.mark.parametrize("clip", CLIPS)
def test_encoder_and_projector_match_transformers(clip, refs, transcriber):
    encoder = transcriber.task.engine.runner.images.vision
    frames = int(refs[f"mask/{clip}"].sum())
    mel = refs[f"mel/{clip}"][:, :frames]
    states = encoder.encoder_states(mel)
    assert states.shape == refs[f"encoder/{clip}"].shape
    np.testing.assert_allclose(states, refs[f"encoder/{clip}"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(encoder.encode(mel), refs[f"features/{clip}"], atol=1e-4, rtol=0)


def test_encoder_in_small_groups_of_chunks_and_windows_is_the_same(refs, transcriber, monkeypatch):
    # a long clip's chunks are convolved CONV_CHUNKS at a time and its windows batched WINDOW_BATCH at a
    # time: groups of 4 chunks (6 chunks: the second group short) and 1 window give the reference's output
    from app.engine.models.audio import qwen3_asr

    monkeypatch.setattr(qwen3_asr, "CONV_CHUNKS", 4)
    monkeypatch.setattr(qwen3_asr, "WINDOW_BATCH", 1)
    encoder = transcriber.task.engine.runner.images.vision
    frames = int(refs["mask/speech"].sum())
    states = encoder.encoder_states(refs["mel/speech"][:, :frames])
    np.testing.assert_allclose(states, refs["encoder/speech"], atol=1e-4, rtol=0)


def test_attention_windows_follow_the_chunks(transcriber):
    cfg = transcriber.prompter.cfg
    assert attention_windows(513, cfg) == [26, 26, 15]  # 5 full chunks (13 each) and 13 frames (2)
    assert attention_windows(50, cfg) == [7]  # one short chunk: its window is its own length x 2
    assert attention_windows(400, cfg) == [26, 26]


@pytest.mark.parametrize("case", sorted(MANIFEST["cases"]))
def test_prompt_and_greedy_tokens_equal_transformers(case, samples, transcriber, monkeypatch):
    expected = MANIFEST["cases"][case]
    monkeypatch.setattr(transcriber, "max_reply_tokens", len(expected["greedy"]))
    ids, reply = transcriber.reply_ids(
        samples[expected["clip"]], expected["language"], min_tokens=len(expected["greedy"])
    )
    assert ids == expected["token_ids"]
    assert reply == expected["greedy"]


def test_reply_splits_into_language_and_transcript(transcriber):
    prompter, tokenizer = transcriber.prompter, transcriber.task.engine.tokenizer
    reply = tokenizer.encode("language German<asr_text>guten Tag", add_special_tokens=False)
    assert prompter.parse(reply) == ("de", "guten Tag")
    reply = tokenizer.encode("language None<asr_text>", add_special_tokens=False)
    assert prompter.parse(reply) == (None, "")
    plain = tokenizer.encode("just text", add_special_tokens=False)  # language prefilled by the prompt
    assert prompter.parse(plain, forced_language="en") == ("en", "just text")


def test_transcript_is_one_segment_over_the_clip(transcriber, monkeypatch):
    monkeypatch.setattr(transcriber, "max_reply_tokens", 12)
    reply = MANIFEST["cases"]["speech/English"]["greedy"]
    transcript = transcriber.transcribe(CLIP, language="English")
    assert transcript.language == "en"
    assert transcript.duration == pytest.approx(MANIFEST["samples"]["speech"] / 16_000, abs=1e-3)
    text = transcriber.task.engine.tokenizer.decode(reply, skip_special_tokens=True).strip()
    assert transcript.text == text
    assert [(s.start, s.end, s.text) for s in transcript.segments] == [(0.0, transcript.duration, text)]


@pytest.mark.parametrize(
    ("payload", "problem"),
    [(b"RIFF\x24\x00\x00\x00WAVEfmt ", "cannot decode"), (b"", "empty")],
)
def test_bad_audio_is_refused_naming_the_file(payload, problem, transcriber, tmp_path):
    path = tmp_path / "meeting.wav"
    path.write_bytes(payload)
    with pytest.raises(AudioError, match=rf"meeting\.wav: .*{problem}"):
        transcriber.transcribe(path)


def _copy_fixture(tmp_path: Path) -> Path:
    folder = tmp_path / "asr"
    shutil.copytree(HF, folder)
    return folder


def test_truncated_weights_are_refused_naming_the_file(tmp_path):
    folder = _copy_fixture(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        SpeechLLMTranscriber.load(folder, device="cpu")


def test_a_config_without_audio_config_is_refused_naming_the_file(tmp_path):
    folder = _copy_fixture(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["audio_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json.*audio_config"):
        load_audio_encoder(folder, config, None)


def test_a_feature_extractor_of_other_mel_bins_is_refused_naming_the_file(tmp_path):
    folder = _copy_fixture(tmp_path)
    settings = json.loads((folder / "preprocessor_config.json").read_text())
    settings["feature_size"] = 80
    (folder / "preprocessor_config.json").write_text(json.dumps(settings))
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"preprocessor_config\.json feature_size 80"):
        load_audio_encoder(folder, config, None)


def test_a_text_model_is_not_taken_as_a_speech_model(tmp_path):
    folder = FIXTURES / "qwen3_tasks" / "embedding"
    with pytest.raises(CheckpointError, match=rf"ASR model {folder}.*not a speech model"):
        SpeechLLMTranscriber.load(folder, device="cpu")


def test_serve_refuses_a_bad_asr_model_naming_it(tmp_path, capsys):
    from app.cli import main

    chat = str(FIXTURES / "families" / "qwen3" / "qwen3-kquants.gguf")
    base = ["serve", "--model", chat, "--device", "cpu", "--port", "0", "--no-mcp", "--no-embeddings"]
    assert main([*base, "--asr-model", str(tmp_path / "missing")]) == 2
    assert f"ASR model {tmp_path / 'missing'}: not a model folder" in capsys.readouterr().err
    text_model = FIXTURES / "qwen3_tasks" / "reranker"
    assert main([*base, "--asr-model", str(text_model)]) == 2
    assert f"ASR model {text_model}: " in capsys.readouterr().err


def test_a_missing_or_misshapen_encoder_tensor_is_named(tmp_path):
    from app.engine.loader.safetensors import read_safetensors_file
    from app.engine.loader.safetensors_write import StoredTensor, write_safetensors

    folder = _copy_fixture(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    weights = folder / "model.safetensors"
    tensors = {
        name: StoredTensor("F32", tuple(t.shape), np.array(t.dequantize(), np.float32))
        for name, t in read_safetensors_file(weights).items()
    }
    dropped = {name: t for name, t in tensors.items() if name != "model.audio_tower.layers.1.fc2.weight"}
    write_safetensors(weights, dropped)
    with pytest.raises(CheckpointError, match=r"lacks model\.audio_tower\.layers\.1\.fc2\.weight"):
        load_audio_encoder(folder, config, None)
    tensors["model.multi_modal_projector.linear_2.weight"] = StoredTensor(
        "F32", (63, 32), np.zeros((63, 32), np.float32)
    )
    write_safetensors(weights, tensors)
    with pytest.raises(
        CheckpointError, match=r"multi_modal_projector\.linear_2\.weight has shape \[63, 32\]"
    ):
        load_audio_encoder(folder, config, None)


def test_audio_too_long_for_the_context_is_refused_naming_the_file():
    small = SpeechLLMTranscriber.load(HF, device="cpu", context=64)
    with pytest.raises(
        AudioError, match=r"speech\.wav: 5 s of audio make a 115-token prompt; .* takes \d+ tokens"
    ):
        small.transcribe(CLIP, language="en")


def test_transcribe_command_runs_a_qwen3_asr_folder(tmp_path, capsys):
    from app.cli import main

    out = tmp_path / "speech.srt"
    args = ["transcribe", str(CLIP), "--model", str(HF), "--device", "cpu", "--language", "en"]
    assert main([*args, "--format", "srt", "--output", str(out)]) == 0
    cue = out.read_text()
    assert cue.startswith("1\n00:00:00,000 --> 00:00:05,131\n") and cue.count(" --> ") == 1
    bad = tmp_path / "notes.wav"
    bad.write_bytes(b"%PDF-1.7\n" * 40)
    assert main(["transcribe", str(bad), "--model", str(HF), "--device", "cpu"]) == 1
    assert "notes.wav: cannot decode" in capsys.readouterr().err


def test_a_cancelled_transcription_stops_and_leaves_the_engine_clean(samples, transcriber, monkeypatch):
    from app.engine.tasks.audio import TranscriptionCancelled

    checks = []

    def cancel() -> bool:  # the client hangs up at the 4th check while the request runs: 3 steps made
        if transcriber.task.engine.has_unfinished():
            checks.append(1)
        return len(checks) > 3

    with pytest.raises(TranscriptionCancelled, match=r"after 3 tokens"):
        transcriber.transcribe(CLIP, language="en", cancel=cancel)
    assert not transcriber.task.engine.has_unfinished()
    expected = MANIFEST["cases"]["speech/English"]
    monkeypatch.setattr(transcriber, "max_reply_tokens", len(expected["greedy"]))
    _, reply = transcriber.reply_ids(samples["speech"], "English", min_tokens=len(expected["greedy"]))
    assert reply == expected["greedy"]
