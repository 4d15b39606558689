"""Async decode on CUDA (core/pipeline.py): decode steps launched from the previous step's ids
on the device (graph replays, row gathers) give the synchronous engine's tokens; the GPU
sampler's launch/resolve gives what sample() gives, with its pinned buffers taken in turn."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _run(model: str, async_decode: bool, requests: dict, sessions: dict | None = None) -> tuple[dict, int]:
    """Tokens per request, and how many steps were launched from device ids."""
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine

    engine = LLMEngine(
        EngineConfig(
            model=model,
            device="cuda",
            max_model_len=1024,
            max_num_seqs=16,
            max_num_batched_tokens=256,
            async_decode=async_decode,
        )
    )
    assert engine.async_decode == async_decode
    ahead = []
    run_from_device = engine.runner.run_from_device
    engine.runner.run_from_device = lambda *args: ahead.append(1) or run_from_device(*args)
    tokens: dict[str, list[int]] = {}
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params, session_id=(sessions or {}).get(rid, "default"))
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    engine.scheduler.check_integrity()
    assert engine.kv.num_used_blocks == 0
    return tokens, len(ahead)


def test_async_decode_gives_the_synchronous_tokens(tiny_gguf: str) -> None:
    """Greedy and seeded rows (top-k, top-p, min-p, min_tokens bans), ending at different steps
    (the steps where one ends are not launched ahead, so every step has the same rows as the
    synchronous run's and the same graph bucket: the tokens must be identical)."""
    from app.engine.sampling_params import SamplingParams

    rng = np.random.default_rng(5)
    kinds = [
        dict(temperature=0.0),
        dict(temperature=0.9, seed=11, top_p=0.9),
        dict(temperature=1.2, seed=12, top_k=40),
        dict(temperature=0.8, seed=13, min_p=0.05, min_tokens=8),
    ]
    requests = {}
    for i, n in enumerate((3, 9, 17, 40, 77, 130, 5, 60, 33, 8, 21, 200)):
        params = SamplingParams(max_tokens=10 + 3 * i, ignore_eos=True, **kinds[i % len(kinds)])
        requests[f"r{i}"] = (rng.integers(0, 256, size=n).tolist(), params)
    sync, ahead_sync = _run(tiny_gguf, False, requests)
    ours, ahead = _run(tiny_gguf, True, requests)
    assert ahead_sync == 0 and ahead > 0
    assert ours == sync


def test_rows_are_gathered_when_the_order_changes(tiny_gguf: str) -> None:
    """Two sessions' chunked prefills end in one step as [b, a]; the decodes after it run as [a, b]."""
    from app.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    requests = {"a": ([3] * 600, params), "b": ([4] * 300, params)}
    sessions = {"a": "s1", "b": "s2"}
    sync, _ = _run(tiny_gguf, False, requests, sessions)
    ours, ahead = _run(tiny_gguf, True, requests, sessions)
    assert ahead > 0 and ours == sync


def test_abort_with_a_step_in_flight_drains(tiny_gguf: str) -> None:
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=tiny_gguf, device="cuda", max_model_len=1024, max_num_seqs=4,
                                    async_decode=True))  # fmt: skip
    for rid in ("a", "b", "c"):
        engine.add_request(
            rid, [1, 2, 3, 4], SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
        )
    for _ in range(5):
        engine.step()
    assert engine.pipeline.in_flight is not None
    engine.abort("b")
    engine.step()  # a look-ahead step of a and c, gathered from rows 0 and 2
    for rid in ("a", "c"):
        engine.abort(rid)
    assert engine.has_unfinished()
    assert engine.step() == [] and not engine.has_unfinished()
    engine.scheduler.check_integrity()
    assert engine.kv.num_used_blocks == 0


def _requests(n: int, **params):
    from app.engine.request import Request
    from app.engine.sampling_params import SamplingParams

    return [Request(f"r{i}", [1, 2, 3], SamplingParams(**params)) for i in range(n)]


def test_gpu_sampler_launch_gives_what_sample_gives(cuda, rng) -> None:
    """Launches overlap as in the engine (launch k+1 before resolving k), so the pinned rings are
    taken in turn while a copy from the other buffer may be pending."""
    from app.engine.sample.gpu import GpuSampler

    batches = []
    for k in range(6):
        raw = rng.standard_normal((5, 151936)).astype(np.float32)
        requests = _requests(2, temperature=0.0) + _requests(
            3, temperature=0.9, top_p=0.8, seed=k, min_tokens=2
        )
        batches.append((raw, requests))
    expected = [
        GpuSampler(frozenset({7})).sample(cuda.from_host(raw), reqs).token_ids for raw, reqs in batches
    ]
    sampler = GpuSampler(frozenset({7}))
    got, pending = [], None
    for raw, reqs in batches:
        launched = sampler.launch(cuda.from_host(raw), reqs)
        if pending is not None:
            got.append(pending.resolve().token_ids)
        pending = launched
        assert cuda.to_host(launched.device_ids).dtype == np.int32
    got.append(pending.resolve().token_ids)
    assert got == expected
    assert cuda.to_host(pending.device_ids).tolist() == expected[-1]
    with pytest.raises(ValueError, match="logprobs"):
        sampler.launch(cuda.from_host(batches[0][0]), _requests(5, temperature=0.0, logprobs=1))
