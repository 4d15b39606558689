"""/v1/embeddings with the openai SDK: float and base64 encodings, usage, limits."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest


def test_float_and_base64_give_the_same_unit_vectors(openai_client, embedder):
    texts = ["the cat sat", "on the mat"]
    as_float = openai_client.embeddings.create(
        model=embedder.model_name, input=texts, encoding_format="float"
    )
    # the SDK asks for base64 by default and decodes it itself; read the raw body to see the encoding
    raw = openai_client.embeddings.with_raw_response.create(
        model=embedder.model_name, input=texts, encoding_format="base64"
    )
    encoded = [item["embedding"] for item in raw.http_response.json()["data"]]
    decoded = np.stack([np.frombuffer(base64.b64decode(e), dtype="<f4") for e in encoded])
    floats = np.array([item.embedding for item in as_float.data], dtype=np.float32)
    np.testing.assert_array_equal(decoded, floats)
    np.testing.assert_allclose(np.linalg.norm(floats, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(floats, embedder.embed(texts))
    assert [item.index for item in as_float.data] == [0, 1]
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens == sum(len(t) for t in texts)


def test_single_string_and_sdk_default_encoding(openai_client, embedder):
    response = openai_client.embeddings.create(model=embedder.model_name, input="hello")
    assert len(response.data) == 1 and len(response.data[0].embedding) == embedder.dimensions


def test_too_long_input_is_refused_naming_both_numbers(openai_client, embedder):
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.embeddings.create(model=embedder.model_name, input=["ok", "x" * 300])
    message = caught.value.body["message"]
    assert "input[1]" in message and "300" in message and str(embedder.max_tokens) in message


def test_token_input_and_wrong_dimensions_are_refused(openai_client, embedder):
    with pytest.raises(openai.BadRequestError):
        openai_client.embeddings.create(model=embedder.model_name, input=[[1, 2, 3]])
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.embeddings.create(model=embedder.model_name, input="x", dimensions=3)
    assert caught.value.body["param"] == "dimensions"


def test_chat_model_name_is_not_an_embedding_model(openai_client, model_name):
    with pytest.raises(openai.NotFoundError):
        openai_client.embeddings.create(model=model_name, input="x")
