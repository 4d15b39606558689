"""Gemma 4 images through the live server, on the tiny random-weight Gemma 4 of
tests/fixtures/gemma4_vision/hf (make_gemma4_vision_reference.py): a corrupt, too large (in bytes or in
pixels) or non-image (audio) part gets a 400 naming the part, through the image checks every vision model
shares; an image adds its soft tokens to the prompt and moves the answer."""

from __future__ import annotations

import base64
import io
import wave
from pathlib import Path

import openai
import pytest
from PIL import Image

from app.engine.config import EngineConfig
from app.engine.core.async_engine import AsyncEngine

from .conftest import running_server
from .helpers import CLIENT_TIMEOUT
from .test_vision_api import _chat, _top

HF = Path(__file__).parents[1] / "fixtures" / "gemma4_vision" / "hf"


@pytest.fixture(scope="module")
def engine():
    client = AsyncEngine(EngineConfig(model=str(HF), device="cpu", max_model_len=256, block_size=4))
    yield client
    client.close()


@pytest.fixture(scope="module")
def oai(engine):
    with running_server(engine, max_images=2, max_image_bytes=64 * 1024) as handle:
        yield openai.OpenAI(
            base_url=f"{handle.base_url}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT
        )


def _data_url(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def _wav() -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(b"\0\0" * 1600)
    return out.getvalue()


@pytest.mark.parametrize(
    ("data", "mime", "says"),
    [
        (b"not an image at all", "image/png", "could not be decoded"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "image/png", "could not be decoded"),
        (b"0" * 70_000, "image/png", "at most 65536 bytes"),
        # a few kilobytes that would decode to 50.4 million pixels: refused from the header
        (_png(Image.new("1", (7100, 7100))), "image/png", "image is 7100x7100 pixels; at most"),
        # audio sent as an image part
        (_wav(), "audio/wav", "could not be decoded"),
    ],
)
def test_bad_images_get_a_400_naming_the_part(oai, engine, data, mime, says):
    url = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    part = {"type": "image_url", "image_url": {"url": url}}
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(oai, engine, [{"type": "text", "text": "hi"}, part])
    assert says in caught.value.body["message"].lower()
    assert caught.value.body["param"] == "messages[0].content[1]"


def test_an_image_adds_its_soft_tokens_and_moves_the_answer(oai, engine):
    question = {"type": "text", "text": "What is this?"}
    image = {"type": "image_url", "image_url": {"url": _data_url((HF.parent / "image.png").read_bytes())}}
    text_only = _chat(oai, engine, [question])
    with_image = _chat(oai, engine, [image, question])
    # <|image>, one <|image|> per 2x2 cell of its 22x12 patch grid, <image|>
    assert with_image.usage.prompt_tokens - text_only.usage.prompt_tokens == 1 + 66 + 1
    assert _top(with_image) != _top(text_only)
