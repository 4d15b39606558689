"""Images through the live server, with the official SDKs, on the tiny random-weight Gemma 3
vision model of tests/fixtures/vision (its weights and tokenizer: make_vision_reference.py).

The prompt token count includes the image's tokens, the answer's logprobs move with the image,
a second identical request reads the image's tokens from the prefix cache, and each way an
image can be wrong gets a 400 naming the part."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from PIL import Image

from app.engine.config import EngineConfig
from app.engine.core.async_engine import AsyncEngine

from .conftest import running_server
from .fakes import FakeEngine
from .helpers import CLIENT_TIMEOUT

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vision"
PNG = (FIXTURES / "images" / "odd_rgba.png").read_bytes()
WIDE = (FIXTURES / "images" / "wide.png").read_bytes()  # pan-and-scan: the image and four crops
B64 = base64.b64encode(PNG).decode()
DATA_URL = f"data:image/png;base64,{B64}"
TOKENS_PER_IMAGE = 16
# Gemma3Processor's image text: "\n\n<start_of_image>" + soft tokens + "<end_of_image>\n\n"; the
# fixture's byte-level tokenizer spells each "\n" as one token
IMAGE_TOKENS = 2 + 1 + TOKENS_PER_IMAGE + 1 + 2


@pytest.fixture(scope="module")
def engine():
    client = AsyncEngine(
        EngineConfig(model=str(FIXTURES / "gemma3" / "hf"), device="cpu", max_model_len=512, block_size=4)
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def server(engine):
    with running_server(engine, max_images=3, max_image_bytes=64 * 1024) as handle:
        yield handle


@pytest.fixture
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT)


@pytest.fixture
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT)


def _chat(oai, engine, content, **extra):
    return oai.chat.completions.create(
        model=engine.model.name,
        messages=[{"role": "user", "content": content}],
        max_tokens=1,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        **extra,
    )


def _top(response) -> list[tuple[str, float]]:
    return [(t.token, round(t.logprob, 4)) for t in response.choices[0].logprobs.content[0].top_logprobs]


def test_models_list_image_input(oai, engine):
    card = oai.models.retrieve(engine.model.name)
    assert card.model_extra["input_modalities"] == ["text", "image"]


def test_openai_image_url_counts_its_tokens_moves_the_logits_and_is_cached_next_time(oai, engine):
    text_only = _chat(oai, engine, [{"type": "text", "text": "What is in the picture?"}])
    parts = [
        {"type": "image_url", "image_url": {"url": DATA_URL}},
        {"type": "text", "text": "What is in the picture?"},
    ]
    first = _chat(oai, engine, parts)
    assert first.usage.prompt_tokens == text_only.usage.prompt_tokens + IMAGE_TOKENS
    assert _top(first) != _top(text_only)
    assert first.usage.prompt_tokens_details.cached_tokens < 10  # the image was new
    again = _chat(oai, engine, parts)
    # everything but the last partial block came from the cache, the image's tokens included
    assert again.usage.prompt_tokens_details.cached_tokens == (again.usage.prompt_tokens - 1) // 4 * 4
    assert again.usage.prompt_tokens_details.cached_tokens > 6 + IMAGE_TOKENS
    assert [t for t, _ in _top(again)] == [t for t, _ in _top(first)]


def test_another_image_at_the_same_place_is_not_a_cache_hit(oai, engine):
    parts = [{"type": "text", "text": "Compare:"}, {"type": "image_url", "image_url": {"url": DATA_URL}}]
    _chat(oai, engine, parts)
    flipped = Image.open(io.BytesIO(PNG)).transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buffer = io.BytesIO()
    flipped.save(buffer, "PNG")
    other = f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}"
    swapped = _chat(oai, engine, [parts[0], {"type": "image_url", "image_url": {"url": other}}])
    assert swapped.usage.prompt_tokens_details.cached_tokens < swapped.usage.prompt_tokens - TOKENS_PER_IMAGE


def test_pan_and_scan_crops_add_their_own_images(oai, engine):
    whole = _chat(oai, engine, [{"type": "image_url", "image_url": {"url": DATA_URL}}])
    wide = f"data:image/png;base64,{base64.b64encode(WIDE).decode()}"
    cropped = _chat(oai, engine, [{"type": "image_url", "image_url": {"url": wide}}])
    assert cropped.usage.prompt_tokens > whole.usage.prompt_tokens + 4 * TOKENS_PER_IMAGE


def test_responses_input_image(oai, engine):
    item = {
        "role": "user",
        "content": [
            {"type": "input_image", "image_url": DATA_URL},
            {"type": "input_text", "text": "Describe."},
        ],
    }
    response = oai.responses.create(model=engine.model.name, input=[item], max_output_tokens=2, temperature=0)
    plain = oai.responses.create(
        model=engine.model.name,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Describe."}]}],
        max_output_tokens=2,
        temperature=0,
    )
    assert response.usage.input_tokens == plain.usage.input_tokens + IMAGE_TOKENS


def test_anthropic_image_block_counts_and_caches(claude, engine):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}
    turn = [{"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}]
    plain = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}]
    name = engine.model.name
    counted = claude.messages.count_tokens(model=name, messages=turn).input_tokens
    assert counted == claude.messages.count_tokens(model=name, messages=plain).input_tokens + IMAGE_TOKENS
    first = claude.messages.create(model=name, max_tokens=2, messages=turn, extra_body={"temperature": 0})
    again = claude.messages.create(model=name, max_tokens=2, messages=turn, extra_body={"temperature": 0})
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens == counted
    assert again.usage.cache_read_input_tokens == (counted - 1) // 4 * 4
    assert again.content[0].text == first.content[0].text


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://example.com/cat.png", "--allow-image-urls"),
        ("data:image/png;base64,@@@@", "not valid base64"),
        ("data:image/png,rawbytes", "must be base64"),
        (
            f"data:image/png;base64,{base64.b64encode(b'not an image at all').decode()}",
            "could not be decoded",
        ),
        (f"data:image/png;base64,{base64.b64encode(b'0' * 70_000).decode()}", "at most 65536 bytes"),
        ("ftp://example.com/cat.png", "must be a data: URL"),
    ],
)
def test_bad_images_get_a_400_naming_the_part(oai, engine, url, says):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(oai, engine, [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}])
    assert says in caught.value.body["message"]
    assert caught.value.body["param"] == "messages[0].content[1]"


def test_too_many_images_get_a_400(oai, engine):
    part = {"type": "image_url", "image_url": {"url": DATA_URL}}
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(oai, engine, [part] * 4)
    assert "4 images; at most 3" in caught.value.body["message"]


def test_the_image_token_typed_as_text_is_refused(oai, engine):
    parts = [
        {"type": "image_url", "image_url": {"url": DATA_URL}},
        {"type": "text", "text": "<image_soft_token>"},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(oai, engine, parts)
    assert "image token" in caught.value.body["message"]


def test_anthropic_bad_image_is_an_anthropic_error(claude, engine):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%%"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model=engine.model.name, max_tokens=2, messages=[{"role": "user", "content": [image]}]
        )
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "not valid base64" in caught.value.body["error"]["message"]


def test_a_text_only_model_says_it_has_no_vision():
    fake = FakeEngine()
    with running_server(fake) as handle:
        body = {
            "model": fake.model.name,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": DATA_URL}}]}
            ],
        }
        response = httpx.post(f"{handle.base_url}/v1/chat/completions", json=body)
        models = httpx.get(f"{handle.base_url}/v1/models").json()
    assert response.status_code == 400
    assert "loaded model has no vision" in response.json()["error"]["message"]
    assert models["data"][0]["input_modalities"] == ["text"]
