"""Images through the live server, with the official SDKs, on the tiny random-weight Qwen2.5-VL
of tests/fixtures/vision/qwen2_5_vl (make_qwen_vl_reference.py): the image's token count depends
on its size (one <|image_pad|> per merged patch, between <|vision_start|> and <|vision_end|>),
the answer moves with the image, and a re-sent image is read from the prefix cache."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import anthropic
import openai
import pytest

from app.engine.config import EngineConfig
from app.engine.core.async_engine import AsyncEngine

from .conftest import running_server
from .helpers import CLIENT_TIMEOUT
from .test_vision_api import _chat, _top  # the same request and reading of its top logprobs

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vision" / "qwen2_5_vl"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def _b64(name: str) -> str:
    return base64.b64encode((FIXTURES / "images" / f"{name}.png").read_bytes()).decode()


def _image_tokens(name: str) -> int:
    t, h, w = MANIFEST["grids"][name]
    return 1 + t * h * w // 4 + 1  # <|vision_start|>, the pads, <|vision_end|>


@pytest.fixture(scope="module")
def engine():
    client = AsyncEngine(
        EngineConfig(model=str(FIXTURES / "hf"), device="cpu", max_model_len=512, block_size=4)
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def server(engine):
    with running_server(engine, max_images=3, max_image_bytes=256 * 1024) as handle:
        yield handle


def test_openai_images_count_their_merged_patches_move_the_logits_and_are_cached(server, engine):
    oai = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT)
    question = {"type": "text", "text": "What is in the pictures?"}
    text_only = _chat(oai, engine, [question])
    images = [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_b64(n)}"}}
        for n in ("wide", "large")
    ]
    first = _chat(oai, engine, [*images, question])
    # image parts are written against their neighbours, as Qwen's template writes them
    added = first.usage.prompt_tokens - text_only.usage.prompt_tokens
    assert added == _image_tokens("wide") + _image_tokens("large") == 2 + 5 + 2 + 12
    assert _top(first) != _top(text_only)
    again = _chat(oai, engine, [*images, question])
    assert again.usage.prompt_tokens_details.cached_tokens == (again.usage.prompt_tokens - 1) // 4 * 4
    assert _top(again) == _top(first)


def test_anthropic_image_block_counts_its_tokens(server, engine):
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64("tall")}}
    turn = [{"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}]
    plain = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}]
    name = engine.model.name
    counted = claude.messages.count_tokens(model=name, messages=turn).input_tokens
    base = claude.messages.count_tokens(model=name, messages=plain).input_tokens
    assert counted == base + _image_tokens("tall") == base + 2 + 8
    first = claude.messages.create(model=name, max_tokens=2, messages=turn, extra_body={"temperature": 0})
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens == counted
