"""/v1/completions with the openai SDK: raw prompts, token prompts, batches, echo, logprobs, streaming."""

from __future__ import annotations

import pytest
from openai.types import Completion

from .fakes import FakeTokenizer

pytestmark = pytest.mark.usefixtures("scripted")  # exact answers come from the fake engine (fakes.py)


def test_completion_continues_a_raw_prompt(openai_client, http, model_name):
    response = openai_client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=100)
    Completion.model_validate(response.model_dump())
    assert response.choices[0].text == "Echo: Once upon a time"
    assert response.choices[0].finish_reason == "stop"
    expected_prompt = http.post("/tokenize", json={"prompt": "Once upon a time"}).json()["count"]
    assert response.usage.prompt_tokens == expected_prompt
    assert response.usage.completion_tokens == len(response.choices[0].text) + 1


def test_default_max_tokens_is_sixteen_as_in_openai(openai_client, model_name):
    response = openai_client.completions.create(model=model_name, prompt="Once upon a time")
    assert response.usage.completion_tokens == 16
    assert response.choices[0].finish_reason == "length"


def test_streamed_completion_matches_and_reports_usage(openai_client, model_name):
    whole = openai_client.completions.create(model=model_name, prompt="abc", max_tokens=50)
    chunks = list(
        openai_client.completions.create(
            model=model_name, prompt="abc", max_tokens=50, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage == whole.usage
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]


def test_token_id_prompts_and_batches(openai_client, model_name):
    ids = FakeTokenizer().encode("hi", add_special_tokens=True)
    response = openai_client.completions.create(model=model_name, prompt=[ids, ids], max_tokens=100)
    assert [c.text for c in response.choices] == ["Echo: hi", "Echo: hi"]
    assert response.usage.prompt_tokens == 2 * len(ids)
    batch = openai_client.completions.create(model=model_name, prompt=["a", "bb"], max_tokens=100, n=2)
    assert [c.text for c in batch.choices] == ["Echo: a", "Echo: a", "Echo: bb", "Echo: bb"]
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]


def test_echo_prepends_the_prompt(openai_client, model_name):
    response = openai_client.completions.create(model=model_name, prompt="abc", echo=True, max_tokens=100)
    assert response.choices[0].text == "abcEcho: abc"
    chunks = list(
        openai_client.completions.create(
            model=model_name, prompt="abc", echo=True, max_tokens=100, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == "abcEcho: abc"


def test_logprobs_carry_tokens_offsets_and_alternatives(openai_client, model_name):
    response = openai_client.completions.create(model=model_name, prompt="abc", logprobs=2, max_tokens=4)
    logprobs = response.choices[0].logprobs
    assert logprobs.tokens == list("Echo")
    assert logprobs.token_logprobs == [-0.25] * 4
    assert logprobs.text_offset == [0, 1, 2, 3]
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
