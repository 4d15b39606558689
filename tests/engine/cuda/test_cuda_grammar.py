"""Grammar masks on the GPU (the apply_token_bitmask kernel) against the numpy sampler, on the tiny
SentencePiece vocabulary of tests/engine/conftest.py."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

EOS = 2
VOCAB = 300
OK_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
OK_TEXTS = (b'{"ok": true}', b'{"ok": false}')


def _request(rid: str, grammar: bool, **params):
    from app.engine.request import Request
    from app.engine.sampling_params import SamplingParams
    from app.engine.text.grammar import GrammarSpec

    spec = GrammarSpec.json_schema(OK_SCHEMA) if grammar else None
    return Request(rid, [1], SamplingParams(grammar=spec, max_tokens=64, **params))


def test_mask_kernel_matches_numpy(cuda, rng, tiny_tokenizer) -> None:
    from app.engine.sample.gpu import GpuSampler
    from app.engine.sample.grammar import GrammarMasks
    from app.engine.sample.ops import apply_token_bitmask

    masks = GrammarMasks(tiny_tokenizer, VOCAB)
    sampler = GpuSampler(frozenset({EOS}), grammars=masks)
    requests = [_request(f"r{i}", grammar=i % 2 == 0) for i in range(5)]
    raw = rng.standard_normal((5, VOCAB)).astype(np.float32)
    expected = raw.copy()
    rows = [0, 2, 4]
    masked = expected[rows]
    apply_token_bitmask(masked, masks.masks([requests[i] for i in rows]))
    expected[rows] = masked
    logits = cuda.from_host(raw)
    sampler._apply_masks(logits, requests, rows)
    np.testing.assert_array_equal(cuda.to_host(logits), expected)


def _until_eos(sample, request, rng, width: int = 1) -> bytes:
    """Sample `request` (beside `width - 1` rows without a grammar) until EOS; its tokens."""
    free = [_request(f"free{i}", grammar=False) for i in range(width - 1)]
    while request.output_token_ids[-1:] != [EOS]:
        raw = rng.normal(0, 3, (width, VOCAB)).astype(np.float32)
        request.output_token_ids.append(sample(raw, [request, *free])[0])
    return request.output_token_ids


def test_gpu_greedy_under_a_grammar_matches_numpy(cuda, rng, tiny_tokenizer) -> None:
    from app.engine.sample.gpu import GpuSampler
    from app.engine.sample.grammar import GrammarMasks
    from app.engine.sample.sampler import Sampler

    gpu = GpuSampler(frozenset({EOS}), grammars=GrammarMasks(tiny_tokenizer, VOCAB))
    host = Sampler(frozenset({EOS}), grammars=GrammarMasks(tiny_tokenizer, VOCAB))
    for walk in range(4):
        on_gpu, on_host = (_request(f"g{walk}", True, temperature=0.0) for _ in range(2))
        while on_host.output_token_ids[-1:] != [EOS]:
            raw = rng.normal(0, 3, (1, VOCAB)).astype(np.float32)
            on_gpu.output_token_ids += gpu.sample(cuda.from_host(raw), [on_gpu]).token_ids
            on_host.output_token_ids += host.sample(raw, [on_host]).token_ids
            assert on_gpu.output_token_ids == on_host.output_token_ids


def test_gpu_draws_at_temperature_one_follow_the_grammar(cuda, rng, tiny_tokenizer) -> None:
    from app.engine.sample.gpu import GpuSampler
    from app.engine.sample.grammar import GrammarMasks

    gpu = GpuSampler(frozenset({EOS}), grammars=GrammarMasks(tiny_tokenizer, VOCAB))
    for seed in range(12):
        request = _request(f"d{seed}", True, temperature=1.0, seed=seed)
        tokens = _until_eos(
            lambda raw, rows: gpu.sample(cuda.from_host(raw), rows).token_ids, request, rng, 3
        )
        assert b"".join(tiny_tokenizer.token_bytes(t) for t in tokens[:-1]) in OK_TEXTS
