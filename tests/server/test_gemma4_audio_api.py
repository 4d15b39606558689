"""Gemma 4 audio through the live server with the OpenAI SDK, on the tiny random-weight Gemma 4 with an
audio tower of tests/fixtures/gemma4_audio/hf (make_gemma4_audio_reference.py).

An `input_audio` part becomes `<|audio>`, one `<|audio|>` per soft token and `<audio|>` where the part
sat, and the answer's first-step log-probs are transformers' for that prompt; each way a part can be
wrong (not base64, over the upload limit, not audio, longer than the model's 30 s, an unknown format)
gets a 400 naming the part and the server keeps serving; a model without audio refuses the part."""

from __future__ import annotations

import base64
import io
import json
import wave
from pathlib import Path

import numpy as np
import openai
import pytest

from app.engine.config import EngineConfig
from app.engine.core.async_engine import AsyncEngine

from .conftest import running_server
from .helpers import CLIENT_TIMEOUT

FIXTURES = Path(__file__).parents[1] / "fixtures"
HF = FIXTURES / "gemma4_audio" / "hf"
MANIFEST = json.loads((FIXTURES / "gemma4_audio" / "manifest.json").read_text())
SPEECH = (FIXTURES / "audio" / "speech.wav").read_bytes()
UPLOAD_LIMIT = 200_000  # bytes of one decoded part: the 164 KB clip fits


def _wav(seconds: float) -> bytes:
    """Silence as 16 kHz mono 16-bit PCM."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(np.zeros(int(seconds * 16_000), np.int16).tobytes())
    return out.getvalue()


def _audio_part(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def _client(handle) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{handle.base_url}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT
    )


def _chat(oai, name, content):
    return oai.chat.completions.create(
        model=name, messages=[{"role": "user", "content": content}], max_tokens=1, temperature=0,
        logprobs=True, top_logprobs=5,
    )  # fmt: skip


@pytest.fixture(scope="module")
def engine():
    client = AsyncEngine(EngineConfig(model=str(HF), device="cpu", max_model_len=512, block_size=4))
    yield client
    client.close()


@pytest.fixture(scope="module")
def oai(engine):
    with running_server(engine, max_audio_body_bytes=UPLOAD_LIMIT) as handle:
        yield _client(handle)


def test_models_list_audio_input(oai, engine):
    card = oai.models.retrieve(engine.model.name)
    assert card.model_extra["input_modalities"] == ["text", "audio"]


def test_input_audio_adds_the_clips_tokens_and_answers_as_transformers(oai, engine):
    question = {"type": "text", "text": MANIFEST["chat"]["question"]}
    text_only = _chat(oai, engine.model.name, [question])
    with_audio = _chat(oai, engine.model.name, [_audio_part(SPEECH), question])
    # <|audio>, the clip's 129 soft tokens, <audio|>: the prompt of the fixture's chat turn
    assert with_audio.usage.prompt_tokens - text_only.usage.prompt_tokens == 1 + 129 + 1
    assert with_audio.usage.prompt_tokens == len(MANIFEST["chat"]["token_ids"])
    with np.load(FIXTURES / "gemma4_audio" / "references.npz") as refs:
        logits = refs["chat/logits"].astype(np.float64)
    expected = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    top = with_audio.choices[0].logprobs.content[0].top_logprobs
    assert [round(t.logprob, 3) for t in top] == [round(v, 3) for v in np.sort(expected)[::-1][:5]]


@pytest.mark.parametrize(
    ("part", "says", "where"),
    [
        (
            {"type": "input_audio", "input_audio": {"data": "%%%not base64%%%"}},
            "not valid base64",
            ".input_audio",
        ),
        (
            _audio_part(b"\x89PNG\r\n\x1a\n" + b"\0" * 64),
            "refused: the file has no audio stream",
            ".input_audio",
        ),
        (
            _audio_part(SPEECH[:30_000] + b"\xff" * 40_000),
            "",
            ".input_audio",
        ),  # a damaged tail: what decodes is used
        (_audio_part(b"0" * (UPLOAD_LIMIT + 100)), f"at most {UPLOAD_LIMIT} bytes", ".input_audio"),
        (_audio_part(_wav(31)[:UPLOAD_LIMIT]), "", ".input_audio"),  # cut short: still a valid 6 s wav
        (_audio_part(SPEECH, fmt="xyz"), "'xyz' is not one this server reads", ".input_audio.format"),
        ({"type": "input_audio", "input_audio": {"format": "wav"}}, "needs {'data'", ""),
    ],
)
def test_bad_audio_parts_get_a_400_naming_the_part(oai, engine, part, says, where):
    question = {"type": "text", "text": "hi"}
    if not says:  # not a bad part after all: its audio is heard (more than 10 soft tokens)
        alone = _chat(oai, engine.model.name, [question]).usage.prompt_tokens
        assert _chat(oai, engine.model.name, [question, part]).usage.prompt_tokens > alone + 10
        return
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(oai, engine.model.name, [question, part])
    assert says in caught.value.body["message"]
    assert caught.value.body["param"] == f"messages[0].content[1]{where}"
    assert _chat(oai, engine.model.name, [question]).choices  # the server keeps serving


def test_a_clip_longer_than_the_model_takes_is_refused(engine):
    with running_server(engine, max_audio_body_bytes=2_000_000) as handle:
        oai = _client(handle)
        with pytest.raises(openai.BadRequestError) as caught:
            _chat(oai, engine.model.name, [_audio_part(_wav(31))])
        assert "longer than the 30 s allowed" in caught.value.body["message"]
        assert caught.value.body["param"] == "messages[0].content[0].input_audio"
        assert (
            _chat(oai, engine.model.name, [_audio_part(_wav(19))]).usage.prompt_tokens > 475
        )  # 19 s: 475 soft tokens


def test_a_model_without_audio_refuses_the_part():
    client = AsyncEngine(
        EngineConfig(
            model=str(FIXTURES / "gemma4_vision" / "hf"), device="cpu", max_model_len=256, block_size=4
        )
    )
    try:
        with running_server(client) as handle, pytest.raises(openai.BadRequestError) as caught:
            _chat(_client(handle), client.model.name, [_audio_part(SPEECH)])
    finally:
        client.close()
    assert caught.value.body["code"] == "model_has_no_audio"
    assert "no audio input" in caught.value.body["message"]
    assert caught.value.body["param"] == "messages[0].content[0].input_audio"
