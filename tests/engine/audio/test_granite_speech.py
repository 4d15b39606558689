"""Granite Speech on the numpy backend against Hugging Face transformers (with PEFT's LoRA adapter).

tests/fixtures/make_granite_speech_reference.py (run in .venv-ref; this test never imports torch) built a
tiny random-weight GraniteSpeechForConditionalGeneration with a LoRA adapter whose B matrices are random
(so it changes the answers) and stored, for the spoken clip tests/fixtures/audio/speech.wav (espeak-ng)
and for its first 0.3 s, the feature extractor's stacked log-mel, the conformer's output and the projected
audio embeddings, the prompt ids (the model card's conversation, its date) and transformers' greedy tokens
with the adapter on, and the first token with it off.

Tolerances: the features and the encoder are float32 computations in another order (numpy's FFT, an erf
good to 1.5e-7): within 1e-4. Greedy tokens must be equal.
"""

from __future__ import annotations

import datetime
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from speech_fixtures import CLIP, FIXTURES, clip_samples, references

from app.engine.loader.names import CheckpointError
from app.engine.models.audio import granite_speech, load_audio_encoder
from app.engine.models.audio.granite_speech_config import GraniteSpeechMelSettings
from app.engine.models.audio.granite_speech_features import input_features
from app.engine.tasks.audio import AudioError
from app.engine.tasks.speech_llm import SpeechLLMTranscriber

HF = FIXTURES / "granite_speech" / "hf"
MANIFEST = json.loads((FIXTURES / "granite_speech" / "manifest.json").read_text())
CLIPS = sorted(MANIFEST["samples"])
CARD_DATE = datetime.date(2025, 4, 9)  # the fixture's prompt carries the model card's date


@pytest.fixture(scope="module")
def refs() -> dict[str, np.ndarray]:
    return references("granite_speech")


@pytest.fixture(scope="module")
def samples() -> dict[str, np.ndarray]:
    return clip_samples(MANIFEST)


@pytest.fixture(scope="module")
def transcriber() -> SpeechLLMTranscriber:
    model = SpeechLLMTranscriber.load(HF, device="cpu")
    model.prompter.today = lambda: CARD_DATE
    return model


def greedy(model: SpeechLLMTranscriber, clip: np.ndarray, count: int) -> tuple[list[int], list[int]]:
    model.max_reply_tokens = count
    return model.reply_ids(clip, None, min_tokens=count)


@pytest.mark.parametrize("clip", CLIPS)
def test_features_match_the_feature_extractor(clip, refs, samples):
    features = input_features(samples[clip], GraniteSpeechMelSettings())
    assert features.shape == refs[f"features/{clip}"].shape
    np.testing.assert_allclose(features, refs[f"features/{clip}"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("clip", CLIPS)
def test_encoder_and_projector_match_transformers(clip, refs, transcriber):
    encoder = transcriber.task.engine.runner.images.vision
    states = encoder.encoder_states(refs[f"features/{clip}"])
    assert states.shape == refs[f"encoder/{clip}"].shape
    np.testing.assert_allclose(states, refs[f"encoder/{clip}"], atol=1e-4, rtol=0)
    audio = encoder.encode(refs[f"features/{clip}"])
    assert audio.shape[0] == MANIFEST["cases"][clip]["audio_tokens"]
    np.testing.assert_allclose(audio, refs[f"audio/{clip}"], atol=1e-4, rtol=0)


def test_attention_blocks_one_at_a_time_give_the_same_states(refs, transcriber, monkeypatch):
    # a long clip's attention blocks go BLOCK_BATCH at a time: one at a time (13 groups, the last short)
    monkeypatch.setattr(granite_speech, "BLOCK_BATCH", 1)
    encoder = transcriber.task.engine.runner.images.vision
    np.testing.assert_allclose(
        encoder.encoder_states(refs["features/speech"]), refs["encoder/speech"], atol=1e-4
    )


@pytest.mark.parametrize("clip", CLIPS)
def test_prompt_and_greedy_tokens_equal_transformers(clip, samples, transcriber):
    expected = MANIFEST["cases"][clip]
    ids, reply = greedy(transcriber, samples[clip], len(expected["greedy"]))
    assert ids == expected["token_ids"]
    assert reply == expected["greedy"]


def test_without_the_adapter_the_answer_is_the_base_models(samples, tmp_path):
    # the adapter matters (transformers' first token differs with it off) and the base path is exact too;
    # a config saying it has no adapter loads without one
    folder = _copy_fixture(tmp_path)
    _edit_json(folder / "config.json", lambda c: c.update(has_lora_adapter=False))
    base = SpeechLLMTranscriber.load(folder, device="cpu")
    base.prompter.today = lambda: CARD_DATE
    expected = MANIFEST["cases"]["speech"]
    _, reply = greedy(base, samples["speech"], 1)
    assert reply == [expected["first_token_no_lora"]] != expected["greedy"][:1]


def test_the_prompt_carries_todays_date_and_the_context(transcriber):
    prompter, tokenizer = transcriber.prompter, transcriber.task.engine.tokenizer
    audio = prompter.audio_input(np.zeros(16_000, np.float32))  # 1 s: 50 frames, 4 windows of 3 queries
    assert prompter.tokens_for(audio) == 12
    prompter.today = lambda: datetime.date(2026, 12, 6)
    try:
        text = tokenizer.decode(prompter.prompt_ids(audio, context="Names: Ada Lovelace."))
    finally:
        prompter.today = lambda: CARD_DATE
    assert "Today's Date: December 6, 2026.\nYou are Granite" in text
    assert "helpful AI assistant\nNames: Ada Lovelace.<|end_of_text|>" in text
    assert text.count("<|audio|>") == 12
    assert text.endswith("<|audio|>can you transcribe the speech into a written format?<|end_of_text|>\n"
                         "<|start_of_role|>assistant<|end_of_role|>")  # fmt: skip


def test_transcript_is_the_reply_as_one_segment_over_the_clip(transcriber):
    transcriber.max_reply_tokens = 12
    reply = MANIFEST["cases"]["speech"]["greedy"]
    text = transcriber.task.engine.tokenizer.decode(reply, skip_special_tokens=True).strip()
    transcript = transcriber.transcribe(CLIP, language="en")
    assert (transcript.text, transcript.language) == (text, "en")  # the model names none: the request's
    duration = MANIFEST["samples"]["speech"] / 16_000
    assert [(s.start, s.end, s.text) for s in transcript.segments] == [
        (0.0, pytest.approx(duration, abs=1e-3), text)
    ]
    assert transcriber.transcribe(CLIP).language == ""


@pytest.mark.parametrize(
    ("payload", "problem"),
    [(b"RIFF\x24\x00\x00\x00WAVEfmt ", "cannot decode"), (b"", "empty")],
)
def test_bad_audio_is_refused_naming_the_file(payload, problem, transcriber, tmp_path):
    path = tmp_path / "meeting.wav"
    path.write_bytes(payload)
    with pytest.raises(AudioError, match=rf"meeting\.wav: .*{problem}"):
        transcriber.transcribe(path)


def test_audio_too_long_for_the_context_is_refused_naming_the_file():
    small = SpeechLLMTranscriber.load(HF, device="cpu", context=128)
    with pytest.raises(
        AudioError, match=r"speech\.wav: 5 s of audio make a \d+-token prompt; hf takes \d+ tokens"
    ):
        small.transcribe(CLIP)


# -- files of this family that are broken, truncated or of the wrong kind ---------------------------------


def _copy_fixture(tmp_path: Path) -> Path:
    folder = tmp_path / "granite-speech"
    shutil.copytree(HF, folder)
    return folder


def _edit_json(path: Path, change) -> None:
    values = json.loads(path.read_text())
    change(values)
    path.write_text(json.dumps(values))


@pytest.mark.parametrize("name", ["model.safetensors", "adapter_model.safetensors"])
def test_truncated_weights_are_refused_naming_the_file(name, tmp_path):
    folder = _copy_fixture(tmp_path)
    weights = folder / name
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"{name.replace('.', '[.]')}.*(truncated|corrupt)"):
        SpeechLLMTranscriber.load(folder, device="cpu")


def test_a_missing_adapter_is_refused_naming_it(tmp_path):
    folder = _copy_fixture(tmp_path)
    (folder / "adapter_config.json").unlink()
    with pytest.raises(
        CheckpointError, match=r"ASR model .*adapter_config\.json: missing; .*has_lora_adapter"
    ):
        SpeechLLMTranscriber.load(folder, device="cpu")
    shutil.copy(HF / "adapter_config.json", folder)
    (folder / "adapter_model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"adapter_model\.safetensors: missing"):
        SpeechLLMTranscriber.load(folder, device="cpu")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda c: c.update(use_dora=True), r"use_dora is True; only plain LoRA"),
        (lambda c: c.update(peft_type="IA3"), r"peft_type 'IA3'"),
        (lambda c: c.update(lora_alpha=0), r"lora_alpha is 0"),
        (lambda c: c.update(modules_to_save=["lm_head"]), r"modules_to_save is \['lm_head'\]"),
        (lambda c: c.update(alora_invocation_tokens=[5, 6]), r"alora_invocation_tokens is \[5, 6\]"),
    ],
)
def test_an_adapter_this_merge_cannot_reproduce_is_refused(change, problem, tmp_path):
    folder = _copy_fixture(tmp_path)
    _edit_json(folder / "adapter_config.json", change)
    with pytest.raises(CheckpointError, match=rf"adapter_config\.json: {problem}"):
        SpeechLLMTranscriber.load(folder, device="cpu")


def test_an_adapter_of_another_model_is_refused_naming_the_tensor(tmp_path):
    from app.engine.loader.safetensors import read_safetensors_file
    from app.engine.loader.safetensors_write import StoredTensor, write_safetensors

    folder = _copy_fixture(tmp_path)
    weights = folder / "adapter_model.safetensors"
    tensors = {n: StoredTensor("F32", tuple(t.shape), np.array(t.dequantize(), np.float32))
               for n, t in read_safetensors_file(weights).items()}  # fmt: skip
    name = "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_B.weight"
    tensors[name] = StoredTensor("F32", (48, 4), np.zeros((48, 4), np.float32))  # another width
    write_safetensors(weights, tensors)
    with pytest.raises(
        CheckpointError,
        match=r"adapter_model\.safetensors: the update of blk\.0\.attn_q\.weight is \[48, 64\]",
    ):
        SpeechLLMTranscriber.load(folder, device="cpu")
    del tensors[name]
    write_safetensors(weights, tensors)
    with pytest.raises(CheckpointError, match=r"layers\.0\.self_attn\.q_proj has lora_A without its pair"):
        SpeechLLMTranscriber.load(folder, device="cpu")


def test_a_config_without_the_projector_is_refused_naming_the_file(tmp_path):
    folder = _copy_fixture(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["projector_config"]
    with pytest.raises(
        CheckpointError, match=r"config\.json: a Granite Speech config needs a projector_config"
    ):
        load_audio_encoder(folder, config, None)


def test_a_feature_extractor_of_other_mel_bins_is_refused_naming_the_file(tmp_path):
    folder = _copy_fixture(tmp_path)
    _edit_json(folder / "preprocessor_config.json", lambda s: s.update(n_mels=128))
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(
        CheckpointError, match=r"config\.json: encoder_config\.input_dim 160 is not two frames .* 128"
    ):
        load_audio_encoder(folder, config, None)


def test_a_missing_or_misshapen_encoder_tensor_is_named(tmp_path):
    from app.engine.loader.safetensors import read_safetensors_file
    from app.engine.loader.safetensors_write import StoredTensor, write_safetensors

    folder = _copy_fixture(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    weights = folder / "model.safetensors"
    tensors = {n: StoredTensor("F32", tuple(t.shape), np.array(t.dequantize(), np.float32))
               for n, t in read_safetensors_file(weights).items()}  # fmt: skip
    dropped = {n: t for n, t in tensors.items() if n != "encoder.layers.1.conv.batch_norm.running_var"}
    write_safetensors(weights, dropped)
    with pytest.raises(CheckpointError, match=r"lacks encoder\.layers\.1\.conv\.batch_norm\.running_var"):
        load_audio_encoder(folder, config, None)
    tensors["projector.query"] = StoredTensor("F32", (1, 5, 24), np.zeros((1, 5, 24), np.float32))
    write_safetensors(weights, tensors)
    with pytest.raises(
        CheckpointError, match=r"projector\.query has shape \[1, 5, 24\], the config needs \[1, 3, 24\]"
    ):
        load_audio_encoder(folder, config, None)


def test_a_text_model_is_not_taken_as_a_speech_model():
    folder = FIXTURES / "qwen3_tasks" / "embedding"
    with pytest.raises(CheckpointError, match=rf"ASR model {folder}.*not a speech model .*GraniteSpeech"):
        SpeechLLMTranscriber.load(folder, device="cpu")


@pytest.mark.parametrize("model", ["hf", "gguf"])  # the Hugging Face folder; llama.cpp's pair in a folder
def test_transcribe_command_runs_a_granite_speech_folder(model, tmp_path, capsys):
    from app.cli import main

    out = tmp_path / "speech.vtt"
    folder = FIXTURES / "granite_speech" / model
    args = ["transcribe", str(CLIP), "--model", str(folder), "--device", "cpu", "--language", "en"]
    assert main([*args, "--format", "vtt", "--output", str(out)]) == 0
    assert out.read_text().startswith("WEBVTT\n\n00:00:00.000 --> 00:00:05.131\n")


def test_will_it_fit_counts_the_encoder_projector_and_adapter(transcriber):
    from app.engine.loader.lora import read_lora_adapter
    from app.engine.models.audio.granite_speech_weights import load_granite_speech_audio
    from app.engine.plan.fit import FitOptions, check_fit, shape_from_checkpoint

    shape = shape_from_checkpoint(HF)
    loaded = load_granite_speech_audio(HF, transcriber.prompter.cfg)  # what the encoder is built from
    assert shape.audio.weight_bytes == sum(t.nbytes for t in loaded.values())
    assert shape.audio.adapter_bytes == 4 * read_lora_adapter(HF, "granite").parameter_count  # float32
    assert shape.weight_bytes == sum(t.nbytes for t in transcriber.task.engine.checkpoint.tensors.values())
    report = check_fit(shape, FitOptions())
    b = report.breakdown
    assert b.audio == shape.audio.total and b.total == b.besides_kv + b.kv_cache
    assert b.total - b.audio == check_fit(replace(shape, audio=None), FitOptions()).breakdown.total
    assert "audio" in report.summary() and "Granite Speech in hf/*.safetensors" in report.summary()


def test_serve_refuses_a_broken_granite_speech_folder_naming_the_file(tmp_path, capsys):
    from app.cli import main

    folder = _copy_fixture(tmp_path)
    adapter = folder / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:100])
    chat = str(FIXTURES / "families" / "qwen3" / "qwen3-kquants.gguf")
    args = ["serve", "--model", chat, "--device", "cpu", "--port", "0", "--no-mcp", "--no-embeddings"]
    assert main([*args, "--asr-model", str(folder)]) == 2
    assert f"{adapter}: " in capsys.readouterr().err


def test_an_audio_token_the_tokenizer_gives_another_id_is_refused(tmp_path):
    folder = _copy_fixture(tmp_path)
    _edit_json(folder / "config.json", lambda c: c.update(audio_token_index=302))
    with pytest.raises(
        CheckpointError, match=r"ASR model .*: tokenizer\.json gives <\|audio\|> id 303, config\.json audio_token_index 302"
    ):
        SpeechLLMTranscriber.load(folder, device="cpu")


# -- llama.cpp's layout: the text GGUF (adapter merged) with its mmproj beside it --------------------------

GGUF = FIXTURES / "granite_speech" / "gguf"
TEXT_GGUF = GGUF / "granite-speech-tiny-f32.gguf"


@pytest.fixture(scope="module")
def from_gguf() -> SpeechLLMTranscriber:
    model = SpeechLLMTranscriber.load(TEXT_GGUF, device="cpu")
    model.prompter.today = lambda: CARD_DATE
    return model


@pytest.mark.parametrize("clip", CLIPS)
def test_the_gguf_pair_gives_transformers_tokens(clip, refs, samples, from_gguf):
    encoder = from_gguf.task.engine.runner.images.vision
    np.testing.assert_allclose(encoder.encoder_states(refs[f"features/{clip}"]), refs[f"encoder/{clip}"], atol=1e-4)
    np.testing.assert_allclose(encoder.encode(refs[f"features/{clip}"]), refs[f"audio/{clip}"], atol=1e-4)
    expected = MANIFEST["cases"][clip]
    ids, reply = greedy(from_gguf, samples[clip], len(expected["greedy"]))
    assert ids == expected["token_ids"]
    assert reply == expected["greedy"]


def test_a_gguf_without_its_mmproj_or_with_another_kind_is_refused(tmp_path):
    shutil.copy(TEXT_GGUF, tmp_path)
    text = tmp_path / TEXT_GGUF.name
    with pytest.raises(CheckpointError, match=r"ASR model .*granite-speech-tiny-f32\.gguf: no mmproj\*\.gguf beside it"):
        SpeechLLMTranscriber.load(text, device="cpu")
    shutil.copy(FIXTURES / "vision" / "gemma3" / "mmproj-gemma3.gguf", tmp_path)
    with pytest.raises(CheckpointError, match=r"mmproj-gemma3\.gguf: clip\.projector_type is 'gemma3', not 'granite_speech'"):
        SpeechLLMTranscriber.load(text, device="cpu")


def test_a_truncated_mmproj_is_refused_naming_it(tmp_path):
    shutil.copy(TEXT_GGUF, tmp_path)
    mmproj = tmp_path / "mmproj-granite-speech-tiny-f32.gguf"
    mmproj.write_bytes((GGUF / mmproj.name).read_bytes()[:60_000])
    with pytest.raises(CheckpointError, match=r"mmproj-granite-speech-tiny-f32\.gguf"):
        SpeechLLMTranscriber.load(tmp_path / TEXT_GGUF.name, device="cpu")


def test_will_it_fit_counts_the_mmproj_beside_a_gguf(from_gguf):
    from app.engine.loader.gguf import read_gguf
    from app.engine.plan.fit import shape_from_checkpoint

    shape = shape_from_checkpoint(TEXT_GGUF)
    mmproj = read_gguf(GGUF / "mmproj-granite-speech-tiny-f32.gguf")
    assert shape.audio.source == "mmproj-granite-speech-tiny-f32.gguf" and shape.audio.adapter_bytes == 0
    assert shape.audio.weight_bytes == sum(t.nbytes for t in mmproj.tensors.values())
    assert shape.audio.activation_bytes == shape_from_checkpoint(HF).audio.activation_bytes  # the same conformer
    assert shape.weight_bytes == sum(t.nbytes for t in from_gguf.task.engine.checkpoint.tensors.values())


def test_a_clip_too_short_for_one_frame_is_refused_naming_the_file(transcriber, tmp_path):
    import wave

    path = tmp_path / "click.wav"
    with wave.open(str(path), "wb") as out:  # 200 samples: shorter than half the 512-point FFT
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes(np.zeros(200, "<i2").tobytes())
    with pytest.raises(AudioError, match=r"click\.wav: 200 samples: the clip must be longer than 256 samples"):
        transcriber.transcribe(path)
