"""A Qwen3-ASR folder served as the chat model takes `input_audio` parts too (tests/fixtures/qwen3_asr,
tiny random weights): the part becomes `<|audio_start|>`, one `<|audio_pad|>` per audio embedding and
`<|audio_end|>`, so an empty system turn and the clip as the user turn are the prompt Qwen3-ASR's own
template renders for transcription, and the answer is transformers' greedy reply for it."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import openai
import pytest

from app.engine.config import EngineConfig
from app.engine.core.async_engine import AsyncEngine

from .conftest import running_server
from .helpers import CLIENT_TIMEOUT

FIXTURES = Path(__file__).parents[1] / "fixtures"
CASE = json.loads((FIXTURES / "qwen3_asr" / "manifest.json").read_text())["cases"]["speech/auto"]
SPEECH = base64.b64encode((FIXTURES / "audio" / "speech.wav").read_bytes()).decode()


# ChatML as Qwen3-ASR's template writes it: every turn, an empty system turn included (the engine's built-in
# ChatML, which the fixture folder would otherwise get, leaves an empty system turn out)
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("asr") / "hf"
    shutil.copytree(FIXTURES / "qwen3_asr" / "hf", folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    client = AsyncEngine(EngineConfig(model=str(folder), device="cpu", max_model_len=512))
    yield client
    client.close()


def test_input_audio_gives_transformers_greedy_reply(engine):
    with running_server(engine) as handle:
        oai = openai.OpenAI(base_url=f"{handle.base_url}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT)
        assert oai.models.retrieve(engine.model.name).model_extra["input_modalities"] == ["text", "audio"]
        n = len(CASE["greedy"])
        reply = oai.chat.completions.create(
            model=engine.model.name,
            messages=[
                {"role": "system", "content": ""},
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": SPEECH, "format": "wav"}}]},
            ],
            max_tokens=n, temperature=0, extra_body={"min_tokens": n},
        )  # fmt: skip
    assert reply.usage.prompt_tokens == len(CASE["token_ids"])
    assert reply.choices[0].message.content == engine.tokenizer.decode(CASE["greedy"], skip_special_tokens=False)
