"""Prefill CUDA graphs (worker/prefill_graphs.py): one prompt at a time, the replayed prefill
(padded to its bucket) gives the eager prefill's first logprobs and the same greedy tokens,
with and without a prefix-cache hit; chunks no bucket holds run eagerly."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _engine(model: str, prefill_graphs: bool):
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine

    return LLMEngine(
        EngineConfig(
            model=model, device="cuda", max_model_len=1024, max_num_seqs=4, prefill_graphs=prefill_graphs
        )
    )


def _one_at_a_time(engine, prompts: list[list[int]]) -> tuple[list[dict], int]:
    """Each prompt generated alone; and how many prefill chunks were graph replays."""
    from app.engine.sampling_params import SamplingParams

    replays = []
    graphs = engine.runner.prefill_graphs
    if graphs is not None:
        run = graphs.run
        graphs.run = lambda *args: replays.append(1) or run(*args)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=3)
    return [engine.generate([p], params)[0] for p in prompts], len(replays)


def test_prefill_graphs_match_eager_prefill(tiny_gguf: str) -> None:
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 256, size=n).tolist() for n in (2, 16, 17, 100, 147, 512, 700)]
    prompts.append(prompts[4][:120] + rng.integers(0, 256, size=40).tolist())  # a prefix-cache hit
    graphed, replays = _one_at_a_time(_engine(tiny_gguf, True), prompts)
    eager, none = _one_at_a_time(_engine(tiny_gguf, False), prompts)
    assert none == 0
    assert replays == 7  # every prompt but the 700-token one (past the largest bucket)
    for got, ref in zip(graphed, eager, strict=True):
        for token, value in ref["logprobs"][0].top:
            assert abs(dict(got["logprobs"][0].top).get(token, -99.0) - value) < 2e-2
        split = next(
            (i for i, (a, b) in enumerate(zip(got["token_ids"], ref["token_ids"], strict=True)) if a != b),
            None,
        )
        if split is not None:  # a split is allowed only at a near-tie
            top = ref["logprobs"][split].top
            assert abs(top[0][1] - top[1][1]) < 2e-2, f"split at {split} without a near-tie"
    assert graphed[-1]["prompt_token_ids"] == prompts[-1]


def test_prefill_bucket_choice(tiny_gguf: str) -> None:
    graphs = _engine(tiny_gguf, True).runner.prefill_graphs
    assert graphs.bucket_for(17, 0) == 32
    assert graphs.bucket_for(512, 0) == 512
    assert graphs.bucket_for(513, 0) is None
    assert graphs.bucket_for(100, 1024 - 110) is None  # its padding would run past the context


def test_split_mixed_steps_match_numpy(tiny_gguf: str, monkeypatch) -> None:
    """PADDOCK_SPLIT_MIXED_STEPS=1: prompts chunked at 48 tokens while others decode, so steps carry decodes and
    one prompt chunk, run as a decode graph's replay and a prefill graph's; greedy tokens and first logprobs as
    the numpy backend's, and such steps did run."""
    from cuda_samples import assert_runs_agree

    from app.engine import envs
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    monkeypatch.setenv("PADDOCK_SPLIT_MIXED_STEPS", "1")
    envs.reload()
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 256, size=n).tolist() for n in (5, 140, 9, 300, 77, 33)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3)
    results = {}
    try:
        for device in ("cpu", "cuda"):
            engine = LLMEngine(EngineConfig(model=tiny_gguf, device=device, max_model_len=1024, max_num_seqs=8,
                                            max_num_batched_tokens=48))  # fmt: skip
            results[device] = engine.generate(prompts, params)
            if device == "cuda":
                assert engine.runner.split_steps > 0
    finally:
        monkeypatch.undo()
        envs.reload()
    assert_runs_agree(results["cuda"], results["cpu"], "split mixed steps")
