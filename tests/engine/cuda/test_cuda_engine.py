"""The whole engine on CUDA (decode CUDA graphs, buckets above 8 tokens included, and eager)
against the numpy backend, on a tiny random-weight Qwen3-shaped Q4_K_M GGUF; and the GPU sampler."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import assert_greedy_agrees

pytestmark = pytest.mark.gpu


def _generate(model: str, device: str, graphs: bool, prompts: list[list[int]]) -> list[dict]:
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    engine = LLMEngine(
        EngineConfig(model=model, device=device, max_model_len=1024, max_num_seqs=16, cuda_graphs=graphs)
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    return engine.generate(prompts, params)


def test_engine_matches_numpy_with_graphs_above_eight_sequences(tiny_gguf: str) -> None:
    """12 sequences decode in the 16-bucket graph (cuBLAS inside the capture); 4 more prompts
    finish alone in the small buckets. Greedy tokens must match the numpy backend's wherever
    its top two logprobs are not a near-tie."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 256, size=n).tolist() for n in (3, 9, 17, 40, 77, 130, 5, 60, 33, 8, 21, 300)]
    reference = _generate(tiny_gguf, "cpu", False, prompts)
    for graphs in (True, False):
        ours = _generate(tiny_gguf, "cuda", graphs, prompts)
        for got, ref in zip(ours, reference, strict=True):
            # the first step's logprobs: comparable even where a near-tie later splits the texts
            for token, value in ref["logprobs"][0].top:
                assert abs(dict(got["logprobs"][0].top).get(token, -99.0) - value) < 5e-2
            assert_greedy_agrees(got, ref, f"graphs={graphs}")


def test_engine_matches_numpy_on_short_context_decode_graphs(tiny_gguf: str, monkeypatch, request) -> None:
    """PADDOCK_DECODE_SHORT_CONTEXT: steps whose every context fits replay the small buckets' second graphs,
    whose attention is planned for that bound; a batch whose longest row grows past it goes back to the plain
    graph mid-generation. Both must match the numpy backend."""
    from app.engine import envs
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    monkeypatch.setenv("PADDOCK_DECODE_SHORT_CONTEXT", "64")
    envs.reload()
    request.addfinalizer(envs.reload)  # drops the cached value: the next read, after monkeypatch's undo, is fresh
    rng = np.random.default_rng(5)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    engine = LLMEngine(EngineConfig(model=tiny_gguf, device="cuda", max_model_len=1024, max_num_seqs=16))
    graphs = engine.runner.graphs
    assert graphs.short_context == 64
    for sizes in ((3, 9, 17, 40), (5, 58)):  # within the bound throughout; one row crosses it at its 7th token
        prompts = [rng.integers(0, 256, size=n).tolist() for n in sizes]
        reference = _generate(tiny_gguf, "cpu", False, prompts)
        before = graphs.short_steps
        ours = engine.generate(prompts, params)
        assert graphs.short_steps > before
        for got, ref in zip(ours, reference, strict=True):
            for token, value in ref["logprobs"][0].top:
                assert abs(dict(got["logprobs"][0].top).get(token, -99.0) - value) < 5e-2
            assert_greedy_agrees(got, ref, f"short context, prompts {sizes}")


def _requests(n: int, **params):
    from app.engine.request import Request
    from app.engine.sampling_params import SamplingParams

    return [Request(f"r{i}", [1, 2, 3], SamplingParams(**params)) for i in range(n)]


def test_gpu_sampler_greedy_is_argmax(cuda, rng) -> None:
    from app.engine.sample.gpu import GpuSampler

    logits = rng.standard_normal((5, 151936)).astype(np.float32)
    logits[2, 17] = logits[2, 99] = 50.0  # a tie: the lowest id wins, as numpy's argmax
    got = GpuSampler(frozenset()).sample(cuda.from_host(logits), _requests(5, temperature=0.0))
    assert got.token_ids == np.argmax(logits, axis=1).tolist()


def test_gpu_sampler_seeded_rows_repeat_and_mixed_batches(cuda, rng) -> None:
    from app.engine.sample.gpu import GpuSampler

    logits = cuda.from_host(rng.standard_normal((4, 1000)).astype(np.float32))
    seeded = _requests(4, temperature=1.0, seed=7)
    first = GpuSampler(frozenset()).sample(logits, seeded).token_ids
    assert GpuSampler(frozenset()).sample(logits, seeded).token_ids == first
    mixed = _requests(2, temperature=0.0) + _requests(2, temperature=0.8, top_k=1)
    got = GpuSampler(frozenset()).sample(logits, mixed).token_ids
    assert got == np.argmax(cuda.to_host(logits), axis=1).tolist()  # greedy and top-k=1 rows


def test_gpu_sampler_bans_stop_ids_until_min_tokens_on_the_device(cuda, rng) -> None:
    """min_tokens (aiperf sets it to max_tokens) bans EOS and stop ids on the GPU: the banned
    best token is never drawn, logprobs still come from the raw logits, and once the minimum
    is reached the ban lifts."""
    from app.engine.sample.gpu import GpuSampler

    eos, stop = 11, 23
    raw = rng.standard_normal((6, 151936)).astype(np.float32)
    raw[:, eos] = 40.0
    raw[:, stop] = 30.0
    logits = cuda.from_host(raw)
    requests = _requests(3, temperature=0.0, min_tokens=4, stop_token_ids=[stop], logprobs=2)
    requests += _requests(3, temperature=0.7, min_tokens=4, seed=5)
    got = GpuSampler(frozenset({eos})).sample(logits, requests)
    ranked = np.argsort(-raw, axis=1)
    assert got.token_ids[:3] == ranked[:3, 2].tolist()  # greedy: the best token neither EOS nor stop
    assert eos not in got.token_ids[3:]
    assert got.logprobs[0].top[0][0] == eos  # logprobs from the raw logits, ban not applied
    np.testing.assert_array_equal(cuda.to_host(logits), raw)  # the caller's logits untouched here
    for request in requests:
        request.output_token_ids.extend([1, 2, 3, 4])
    after = GpuSampler(frozenset({eos})).sample(logits, requests[:3])
    assert after.token_ids == [eos] * 3
