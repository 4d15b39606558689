"""Muse Glimmer images through the live server, on the tiny random-weight model of
tests/fixtures/muse_glimmer_vision/hf (make_muse_glimmer_vision_reference.py): an image_url part's answer is
the engine's for the same prompt (`<|image_start|>`, one `<|patch|>` per merged cell, `<|image_end|>` where
the part sat); a corrupt, too large or non-image part gets a 400 naming the part; `paddock serve` with a
corrupt mmproj stops before serving, naming the file and the tensor."""

from __future__ import annotations

import base64
from pathlib import Path

import openai
import pytest

from app.engine.config import EngineConfig
from app.engine.core.async_engine import AsyncEngine
from app.engine.core.engine import LLMEngine
from app.engine.sampling_params import SamplingParams

from .conftest import running_server
from .helpers import CLIENT_TIMEOUT
from .test_vision_api import _chat

FIXTURE = Path(__file__).parents[1] / "fixtures" / "muse_glimmer_vision"
HF = FIXTURE / "hf"
QUESTION = "What is this?"
MAX_TOKENS = 6


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


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(out, "PNG")
    return out.getvalue()


def _data_url(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


def _engine_answer(image: bytes) -> tuple[list[int], str]:
    """The prompt ids the chat should make (the template's render, the image's tokens in place of its
    part) and the engine's own greedy text for them."""
    local = LLMEngine(EngineConfig(model=str(HF), device="cpu", max_model_len=256, block_size=4))
    prepared = local.vision.prepare(image)
    mark = "\ue000"  # stands for the image part while the template renders; written against the text
    text = local.chat_template.render([{"role": "user", "content": f"{mark}{QUESTION}"}], add_generation_prompt=True)
    text = text.replace(mark, "<|image_start|>" + "<|patch|>" * 15 + "<|image_end|>")
    ids = local.tokenizer.encode(text, add_special_tokens=True, parse_special=True)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    [result] = local.generate([ids], params, images=[list(prepared.views)])
    return ids, local.tokenizer.decode(result["token_ids"])


def test_an_image_part_is_answered_as_the_engine_answers_it(oai, engine):
    image = (FIXTURE / "image.png").read_bytes()
    ids, expected = _engine_answer(image)
    parts = [{"type": "image_url", "image_url": {"url": _data_url(image)}}, {"type": "text", "text": QUESTION}]
    response = oai.chat.completions.create(
        model=engine.model.name,
        messages=[{"role": "user", "content": parts}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert response.usage.prompt_tokens == len(ids)
    assert response.choices[0].finish_reason == "length"  # all MAX_TOKENS tokens compared
    assert response.choices[0].message.content == expected
    again = oai.chat.completions.create(
        model=engine.model.name, messages=[{"role": "user", "content": parts}], max_tokens=MAX_TOKENS, temperature=0
    )
    assert again.choices[0].message.content == expected
    # the repeat's prefix, image tokens included, came from the cache
    assert again.usage.prompt_tokens_details.cached_tokens > ids.index(257)
    text_only = _chat(oai, engine, [{"type": "text", "text": QUESTION}])
    assert response.usage.prompt_tokens - text_only.usage.prompt_tokens == 1 + 15 + 1


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"not an image at all", "could not be decoded"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "could not be decoded"),
        (b"0" * 70_000, "at most 65536 bytes"),
        (_png(3000, 1), "aspect ratio is too extreme for 24 image tokens"),
    ],
)
def test_bad_images_get_a_400_naming_the_part(oai, engine, data, says):
    part = {"type": "image_url", "image_url": {"url": _data_url(data)}}
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(oai, engine, [{"type": "text", "text": "hi"}, part])
    assert says in caught.value.body["message"]
    assert caught.value.body["param"] == "messages[0].content[1]"


def test_paddock_serve_refuses_a_corrupt_mmproj_naming_file_and_tensor(tmp_path, capsys, monkeypatch):
    import gguf
    import numpy as np

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "engine"))  # the GGUF writers the engine tests use
    from muse_glimmer_gguf import write_gguf, write_mmproj

    from app.cli import main as paddock

    text = tmp_path / "muse-glimmer.gguf"
    write_gguf(HF, text, gguf.GGMLQuantizationType.F32)
    bad = tmp_path / "vision.gguf"
    write_mmproj(HF, bad, replace={"mm.2.weight": np.zeros((64, 40), np.float32)})
    code = paddock(["serve", "--model", str(text), "--mmproj", str(bad), "--device", "cpu", "--port", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{bad}: tensor mm.2.weight has shape (64, 40), expected (64, 48)" in err
