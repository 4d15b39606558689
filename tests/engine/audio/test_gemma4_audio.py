"""Gemma 4's audio front end and tower on the numpy backend against Hugging Face transformers.

tests/fixtures/make_gemma4_audio_reference.py (run in .venv-ref; this test never imports torch) built
a tiny random-weight Gemma4ForConditionalGeneration with an audio tower (clipped linears whose bounds
clip, 12-position attention chunks, a causal light convolution) and stored, for the spoken clip
tests/fixtures/audio/speech.wav and its first 0.3 s, Gemma4AudioFeatureExtractor's log-mel and frame
mask, the tower's output (after output_proj, padding tokens dropped) and the audio embedder's output.

Tolerances: float32 on both sides in another summation order: within 1e-4 (the outputs are of order 1).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from family_parity import check_top_logprobs

from app.engine.backend.cpu import CpuBackend
from app.engine.loader.names import CheckpointError
from app.engine.models.audio.gemma4_audio import Gemma4AudioTower, block_mask
from app.engine.models.audio.gemma4_audio_config import gemma4_audio_config, load_gemma4_audio
from app.engine.models.audio.gemma4_audio_features import gemma4_log_mel, soft_tokens, valid_frames
from app.engine.tasks.audio import decode_audio

FIXTURES = Path(__file__).parents[2] / "fixtures"
HF = FIXTURES / "gemma4_audio" / "hf"
MANIFEST = json.loads((FIXTURES / "gemma4_audio" / "manifest.json").read_text())
CLIPS = sorted(MANIFEST["samples"])


@pytest.fixture(scope="module")
def refs() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "gemma4_audio" / "references.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def samples() -> dict[str, np.ndarray]:
    clip = decode_audio(FIXTURES / "audio" / "speech.wav")
    return {name: clip[:count] for name, count in MANIFEST["samples"].items()}


@pytest.fixture(scope="module")
def cfg():
    return gemma4_audio_config(HF, json.loads((HF / "config.json").read_text()))


@pytest.fixture(scope="module")
def tower(cfg) -> Gemma4AudioTower:
    return Gemma4AudioTower(CpuBackend(), cfg, load_gemma4_audio(HF, cfg))


@pytest.mark.parametrize("clip", CLIPS)
def test_log_mel_matches_the_feature_extractor(clip, refs, samples, cfg):
    mel = gemma4_log_mel(samples[clip], cfg.mel)
    mask = refs[f"mask/{clip}"].astype(bool)
    assert mel.shape == (int(mask.sum()), 128) == (valid_frames(samples[clip].size, cfg.mel), 128)
    np.testing.assert_allclose(mel, refs[f"mel/{clip}"][mask], atol=1e-4, rtol=0)
    assert not refs[f"mel/{clip}"][~mask].any()  # the padding frames are zeros the model masks out


@pytest.mark.parametrize("clip", CLIPS)
def test_tower_and_embedder_match_transformers(clip, refs, tower):
    mel = refs[f"mel/{clip}"][refs[f"mask/{clip}"].astype(bool)]
    out = np.asarray(tower.tower(mel))
    assert out.shape == refs[f"tower/{clip}"].shape == (soft_tokens(mel.shape[0]), 24)
    np.testing.assert_allclose(out, refs[f"tower/{clip}"], atol=1e-4, rtol=0)
    embedded = np.asarray(tower.encode(mel))
    assert embedded.shape == (out.shape[0], 48)  # the text width
    np.testing.assert_allclose(embedded, refs[f"embedded/{clip}"], atol=1e-4, rtol=0)


def test_soft_token_counts_follow_the_processor():
    # Gemma4Processor: the frame mask halved twice, rounding up (a stride-2 conv keeps mask[::2])
    assert [soft_tokens(n) for n in (1, 4, 5, 29, 513)] == [1, 1, 2, 8, 129]
    assert soft_tokens(0) == 0


def test_attention_window_is_causal_and_local(cfg):
    mask = block_mask(cfg, 30)  # 3 blocks of 12 queries; block b's keys start 12 positions before it
    assert mask.shape == (3, 12, 24)
    keys = np.flatnonzero(mask[1, 1]) + 1 * 12 - 12  # query 13 (block 1, row 1)
    assert list(keys) == list(range(2, 14))  # itself and 11 back (attention_context_left 13), none ahead
    assert list(np.flatnonzero(mask[0, 0]) - 12) == [0]  # the first query: nothing before the clip
    assert list(np.flatnonzero(mask[2, 5]) + 2 * 12 - 12) == list(range(18, 30))
    assert (
        np.flatnonzero(mask[2, 11]) + 2 * 12 - 12 < 30
    ).all()  # a query past the clip reads inside it only


def test_a_missing_or_misshapen_tensor_is_named(tmp_path, cfg):
    from app.engine.loader.safetensors import read_safetensors_file
    from app.engine.loader.safetensors_write import StoredTensor, write_safetensors

    folder = tmp_path / "hf"
    shutil.copytree(HF, folder)
    weights = folder / "model.safetensors"
    tensors = {
        name: StoredTensor("F32", tuple(t.shape), np.array(t.dequantize(), np.float32))
        for name, t in read_safetensors_file(weights).items()
    }
    name = "model.audio_tower.layers.1.self_attn.relative_k_proj.weight"
    write_safetensors(weights, {k: t for k, t in tensors.items() if k != name})
    with pytest.raises(CheckpointError, match=f"lacks {name}"):
        load_gemma4_audio(folder, cfg)
    tensors["model.embed_audio.embedding_projection.weight"] = StoredTensor(
        "F32", (48, 23), np.zeros((48, 23), np.float32)
    )
    write_safetensors(weights, tensors)
    with pytest.raises(
        CheckpointError, match=r"embed_audio\.embedding_projection\.weight has shape \[48, 23\]"
    ):
        load_gemma4_audio(folder, cfg)


def test_bad_audio_config_is_named(tmp_path):
    config = json.loads((HF / "config.json").read_text())
    config["audio_config"]["num_attention_heads"] = 0
    with pytest.raises(CheckpointError, match=r"audio_config\.num_attention_heads is 0"):
        gemma4_audio_config(HF, config)


@pytest.fixture(scope="module")
def engine():
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(HF), device="cpu", max_model_len=512, block_size=4))


def _run(engine, ids, items, tokens):
    from app.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, min_tokens=tokens, logprobs=5)
    engine.add_request(f"r{id(items)}", ids, params, images=items)
    out, first = [], None
    while engine.has_unfinished():
        for step in engine.step():
            out += step.new_token_ids
            first = first or step.logprobs
    return out, first[0]


def test_chat_turn_with_the_clip_equals_transformers(engine, samples, refs):
    """The processor's placeholder expansion, the tower spliced into a PLE text model (audio positions'
    per-layer token part is the pad token's, their projection part the audio embeddings): the same prompt
    ids, first-step log-probs within 1e-4 and greedy tokens as transformers."""
    chat = MANIFEST["chat"]
    assert engine.info.supports_audio and not engine.info.supports_vision
    clip = engine.audio.audio_input(samples["speech"])
    assert clip.modality == "audio" and engine.audio.tokens_for(clip) == 129
    text = f"<bos><|turn>user\n{engine.audio.expansion(clip)}{chat['question']}<turn|>\n<|turn>model\n"
    ids = engine.tokenizer.encode(text, add_special_tokens=False, parse_special=True)
    assert ids == chat["token_ids"]
    greedy, first = _run(engine, ids, [clip], len(chat["greedy"]))
    assert greedy == chat["greedy"]
    check_top_logprobs(first.top, refs["chat/logits"].astype(np.float64), 5, atol=1e-4)


def test_audio_moves_the_answer_and_placement_is_checked(engine, samples):
    from app.engine.core.audio import NoAudioError
    from app.engine.core.vision import place_images

    clip = engine.audio.audio_input(samples["short"])
    ids = engine.tokenizer.encode(f"<bos>{engine.audio.expansion(clip)}Hi", add_special_tokens=False)
    assert ids[1:3] == [264, 266] and ids.count(266) == 8
    placed = place_images(engine.vision, ids, [clip], engine.audio)
    assert [(p.start, p.end) for p in placed] == [(2, 10)]
    with pytest.raises(ValueError, match=r"the audio tokens at 2\.\.9 are 8, not the 9 the clip takes"):
        place_images(None, ids, [engine.audio.audio_input(samples["speech"][:5600])], engine.audio)
    with pytest.raises(ValueError, match="1 runs of audio tokens for 2 audios"):
        place_images(None, ids, [clip, clip], engine.audio)
    with pytest.raises(NoAudioError, match="has no audio: it cannot take audios"):
        place_images(None, ids, [clip], None)
    silence = engine.audio.audio_input(np.zeros(4800, np.float32))
    _, with_clip = _run(engine, ids, [clip], 1)
    _, with_silence = _run(engine, ids, [silence], 1)
    assert abs(with_clip.logprob - with_silence.logprob) > 1e-3  # the soft tokens carry the clip


def test_clips_the_model_cannot_take_are_refused(engine):
    from app.engine.models.audio.gemma4_audio_prompter import AudioClipError

    with pytest.raises(AudioClipError, match=r"31\.0 s long; the model takes at most 30 s"):
        engine.audio.audio_input(np.zeros(31 * 16_000, np.float32))
    with pytest.raises(AudioClipError, match="10 ms long, too short"):
        engine.audio.audio_input(np.zeros(160, np.float32))


def test_image_and_audio_inputs_go_to_their_own_towers():
    """A model with both towers (Gemma 4 E-series): each input is encoded by its modality's tower, and
    only images get two-way spans in the text model (audio tokens stay causal, as in transformers)."""
    from types import SimpleNamespace

    from app.engine.images import ImageInput, PromptImage
    from app.engine.worker.images import ImageEmbedder, SoftTokenTowers

    class Tower:
        def __init__(self, value: float, two_way: bool) -> None:
            self.value, self.two_way_images = value, two_way

        def encode_image(self, item):
            return np.full((item.pixel_values.shape[0], 2), self.value, np.float32)

    embedder = ImageEmbedder(SoftTokenTowers(image=Tower(1.0, True), audio=Tower(2.0, False)), CpuBackend())
    image = ImageInput(np.zeros((3, 4), np.float32))
    clip = ImageInput(np.zeros((2, 4), np.float32), modality="audio")
    request = SimpleNamespace(images=[PromptImage(1, 4, image), PromptImage(6, 8, clip)])
    (rows, values), spans = embedder.step_inputs([SimpleNamespace(request=request, start=0, num_tokens=10)])
    assert list(rows) == [1, 2, 3, 6, 7] and list(values[:, 0]) == [1, 1, 1, 2, 2]
    assert spans == [[(1, 4)]]  # the image's span only
    with pytest.raises(ValueError, match="no audio tower"):
        SoftTokenTowers(image=Tower(1.0, True)).encode_image(clip)


@pytest.mark.parametrize("variant", sorted(MANIFEST["variants"]))
def test_other_extractor_settings_read_from_the_folder_match(variant, refs, samples, tmp_path):
    """Pre-emphasis (HTK's and the plain kind), input scaling, per-bin normalisation, the FFT overdrive and
    a narrower band, as a folder's preprocessor_config.json gives them, against the extractor's log-mel."""
    folder = tmp_path / "hf"
    shutil.copytree(HF, folder)
    settings = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps({**settings, **MANIFEST["variants"][variant]}))
    cfg = gemma4_audio_config(folder, json.loads((folder / "config.json").read_text()))
    mel = gemma4_log_mel(samples["short"], cfg.mel)
    np.testing.assert_allclose(mel, refs[f"mel/{variant}"], atol=1e-4, rtol=0)
