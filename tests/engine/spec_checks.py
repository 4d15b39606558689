"""Checks shared by the speculative-decoding tests (test_speculative.py, test_hybrid_speculative.py):
sampled tokens under drafts keep the target's distribution (a chi-square test against the model's own
top-k probabilities)."""

from __future__ import annotations

import numpy as np

from app.engine.core.engine import LLMEngine
from app.engine.sampling_params import SamplingParams
from app.engine.spec.policy import SpecPolicy
from app.engine.spec.speculator import Speculator


class FixedDrafter:
    """Always proposes the same drafts: a test's control over which tokens get verified."""

    def __init__(self, drafts: list[int]) -> None:
        self.drafts = drafts

    def propose(self, tokens: list[int], k: int) -> list[int]:
        return self.drafts[:k]


def top_probs(engine: LLMEngine, prompt: list[int], top_k: int) -> dict[int, float]:
    """The sampler's distribution after `prompt` at temperature 1 with top-k: the model's top-k
    probabilities renormalised."""
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=top_k)
    speculator, engine.speculator = engine.speculator, None
    try:
        top = engine.generate([prompt], params)[0]["logprobs"][0].top
    finally:
        engine.speculator = speculator
    probs = np.exp([lp for _, lp in top])
    return {t: float(p) for (t, _), p in zip(top, probs / probs.sum(), strict=True)}


def chi_square(counts: dict[int, int], probs: dict[int, float]) -> float:
    n = sum(counts.values())
    assert set(counts) <= set(probs), f"drew tokens outside the top-k: {set(counts) - set(probs)}"
    return sum((counts.get(t, 0) - n * p) ** 2 / (n * p) for t, p in probs.items())


def assert_sampled_tokens_keep_the_distribution(engine: LLMEngine, prompt: list[int], top_k: int = 4) -> None:
    """Every request's first decode verifies two drafts: one the model likes (accepted, or rejected and
    resampled without it) and, after it, one the model rarely takes; later decodes verify the same two
    (mostly rejected). Given the prefill's token t0, the tokens at both drafted positions must follow
    the model's own top-k distribution. `engine`: a speculative one of at least 64 sequences."""
    start = top_probs(engine, prompt, top_k)
    t0 = max(start, key=start.__getitem__)  # the prefill's likeliest token (p ~ 0.5): half the draws start with it
    first = top_probs(engine, [*prompt, t0], top_k)
    draft0 = max(first, key=first.__getitem__)
    second = top_probs(engine, [*prompt, t0, draft0], top_k)
    draft1 = min(second, key=second.__getitem__)  # the rejection path, mostly
    speculator = engine.speculator
    assert isinstance(speculator, Speculator)
    speculator.drafter = FixedDrafter([draft0, draft1])
    speculator.policy = SpecPolicy(max_k=2, min_k=2, max_batch=64)
    params = SamplingParams(max_tokens=4, temperature=1.0, top_k=top_k, ignore_eos=True)
    tokens = []
    for _ in range(20):  # 1,280 draws: rows share the engine's generator, so each is its own draw
        tokens += [r["token_ids"] for r in engine.generate([prompt] * 64, params)]
    assert speculator.drafted >= 2 * len(tokens)  # each request's first decode verified both drafts
    firsts: dict[int, int] = {}
    seconds: dict[int, int] = {}
    for out in tokens:
        if out[0] != t0:
            continue
        firsts[out[1]] = firsts.get(out[1], 0) + 1
        if out[1] == draft0:
            seconds[out[2]] = seconds.get(out[2], 0) + 1
    assert sum(seconds.values()) >= 150, (firsts, seconds)
    # df = 3; chi-square above 16.27 has probability 0.001 under the hypothesis
    assert chi_square(firsts, first) < 16.27, (firsts, first)
    assert chi_square(seconds, second) < 16.27, (seconds, second)
