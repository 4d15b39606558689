"""Whole-prompt scoring through the decoder: final logits against transformers, last-token
embeddings, the yes/no reranker, and running them on the engine thread of an AsyncEngine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.engine.config import EngineConfig
from app.engine.core.async_engine import AsyncEngine
from app.engine.core.engine import LLMEngine
from app.engine.tasks.pooling import DecoderEmbedder, PromptRunner, decoder_reranker
from app.engine.tasks.rerank import DECODER_YES_NO, rerank

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASE = next(c for c in MANIFEST["cases"] if c["name"] == "qwen3-gguf")
TOKENS = MANIFEST["tokens"]


@pytest.fixture(scope="module")
def small_engine() -> LLMEngine:
    # A token budget of 16 makes the 40-token prompt run in three chunks.
    config = EngineConfig(model=str(FIXTURES / CASE["path"]), device="cpu", max_model_len=64,
                          max_num_seqs=4, max_num_batched_tokens=16)  # fmt: skip
    return LLMEngine(config)


def test_final_logits_match_transformers_at_the_prompts_last_position(small_engine):
    with np.load(FIXTURES / "references.npz") as refs:
        reference = refs[CASE["name"]]  # transformers' logits at every position of TOKENS
    lengths = (1, 7, 23, 40)
    logits = PromptRunner(small_engine).final_logits([TOKENS[:n] for n in lengths])
    tolerance = 1e-5 * max(1.0, float(np.abs(reference).max()))
    for row, n in zip(logits, lengths, strict=True):
        assert np.abs(row - reference[n - 1]).max() <= tolerance, f"prompt of {n} tokens"
    assert small_engine.kv.num_used_blocks == 0, "pooling must give its KV blocks back"


def test_last_hidden_is_what_the_output_projection_reads(small_engine):
    runner = PromptRunner(small_engine)
    prompts = [TOKENS[:9], TOKENS[:33]]
    hidden = runner.last_hidden(prompts)
    assert hidden.shape == (2, small_engine.model_config.hidden_size)
    np.testing.assert_allclose(small_engine.model.logits(hidden), runner.final_logits(prompts), rtol=0, atol=1e-5)


def test_decoder_embeddings_are_unit_vectors_of_the_last_token(small_engine):
    embedder = DecoderEmbedder(small_engine)
    texts = ["hello there", "hello there", "a different text entirely"]
    vectors = embedder.embed(texts)
    assert vectors.shape == (3, embedder.dimensions) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert np.array_equal(vectors[0], vectors[1]) and not np.allclose(vectors[0], vectors[2])
    eos = small_engine.tokenizer.eos_token_id
    assert embedder.count_tokens(["hello"]) == [len(small_engine.tokenizer.encode("hello")) + (eos is not None)]
    with pytest.raises(ValueError, match="at most 64"):
        embedder.embed(["x" * 200])


def test_reranker_and_embedder_run_on_the_async_engine_thread(embedded_engine):
    engine = AsyncEngine(engine=embedded_engine)
    try:
        on_engine = lambda fn: engine.call(fn).result(timeout=300)  # noqa: E731
        embedder = DecoderEmbedder(embedded_engine, run_on_engine=on_engine)
        vectors = embedder.embed(["The cat sat on the mat.", "Stock markets fell sharply today."])
        assert vectors.shape == (2, 640)
        ranking = rerank("What did the cat do?", ["The cat sat on the mat.", "Rain is forecast."],
                         reranker=decoder_reranker(embedded_engine, on_engine))  # fmt: skip
        assert ranking.method == DECODER_YES_NO
        assert all(0.0 <= r.relevance_score <= 1.0 for r in ranking.results)
        failed = engine.call(lambda: PromptRunner(embedded_engine).final_logits([[]]))
        with pytest.raises(ValueError, match="empty"):
            failed.result(timeout=60)
    finally:
        engine.close()
    assert embedded_engine.kv.num_used_blocks == 0
