"""The OpenAI SDK's embeddings.create against the live server with the shipped MiniLM embedder,
compared with sentence-transformers' own vectors (tests/fixtures/make_embedding_reference.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import openai

from app.engine.embeddings import load_default_embedder

from .conftest import running_server
from .fakes import FakeEngine
from .helpers import CLIENT_TIMEOUT

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "embeddings"


def test_sdk_embeddings_match_sentence_transformers():
    sentences = [s["text"] for s in json.loads((FIXTURES / "minilm_sentences.json").read_text())["sentences"]]
    reference = np.load(FIXTURES / "minilm_reference.npy")
    chosen = [i for i, text in enumerate(sentences) if text.strip()][:12]  # the API refuses empty strings
    embedder = load_default_embedder()
    with running_server(FakeEngine(), embedder) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=CLIENT_TIMEOUT)
        response = client.embeddings.create(model=embedder.model_name, input=[sentences[i] for i in chosen])
        as_base64 = client.embeddings.create(
            model=embedder.model_name, input=[sentences[chosen[0]]], encoding_format="base64"
        )
    vectors = np.array([d.embedding for d in response.data], dtype=np.float32)
    cosines = np.sum(vectors * reference[chosen], axis=1) / (
        np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference[chosen], axis=1)
    )
    assert cosines.min() >= 0.999, f"worst cosine {cosines.min():.6f}"
    assert response.usage.prompt_tokens == sum(embedder.count_tokens([sentences[i] for i in chosen]))
    decoded = np.frombuffer(base64.b64decode(as_base64.data[0].embedding), dtype="<f4")  # the SDK leaves it encoded
    np.testing.assert_allclose(decoded, vectors[0], rtol=0, atol=1e-6)
