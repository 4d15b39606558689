from __future__ import annotations

import numpy as np
import pytest

from app.engine.request import Request
from app.engine.sample.sampler import Sampler
from app.engine.sampling_params import SamplingParams

EOS = 7
DRAWS = 20_000


def request(
    rid: str = "r", prompt: tuple[int, ...] = (1, 2), output: tuple[int, ...] = (), **params
) -> Request:
    r = Request(rid, list(prompt), SamplingParams(**params))
    r.output_token_ids = list(output)
    return r


def softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def reference_probs(logits: np.ndarray, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """The filtered distribution, computed directly with full sorts (HF order: k, p, min-p)."""
    x = np.asarray(logits, dtype=np.float64) / temperature
    if 0 < top_k < len(x):
        x[x < np.sort(x)[::-1][top_k - 1]] = -np.inf
    if top_p < 1.0:
        probs = softmax(x)
        order = np.argsort(-x, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]
        drop = order[before >= top_p]
        x[drop] = -np.inf
    if min_p > 0.0:
        probs = softmax(x)
        x[probs < min_p * probs.max()] = -np.inf
    return softmax(x)


def frequencies(logits: np.ndarray, req: Request, seed: int = 0) -> np.ndarray:
    """Draw DRAWS tokens for the same request and logits (one batch row each)."""
    out = Sampler(frozenset({EOS}), default_seed=seed).sample(np.tile(logits, (DRAWS, 1)), [req] * DRAWS)
    return np.bincount(out.token_ids, minlength=len(logits)) / DRAWS


def assert_matches(freq: np.ndarray, expected: np.ndarray) -> None:
    assert np.all(freq[expected == 0] == 0), "a filtered-out token was drawn"
    # binomial standard error is at most 0.0036 at 20k draws: 0.02 is over 5 of them
    np.testing.assert_allclose(freq, expected, atol=0.02)


LOGITS = np.array([2.0, 1.5, 1.2, 0.3, -0.4, 0.9, -1.0, -3.0, 0.1, 1.1], dtype=np.float32)


def test_greedy_takes_the_argmax_and_the_lowest_id_on_ties() -> None:
    logits = np.array([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0]], dtype=np.float32)
    out = Sampler(frozenset()).sample(logits, [request(temperature=0.0), request(temperature=0.0)])
    assert out.token_ids == [1, 0]
    assert out.logprobs == [None, None]


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_temperature_sampling_matches_the_softmax(temperature: float) -> None:
    freq = frequencies(LOGITS, request(temperature=temperature))
    assert_matches(freq, reference_probs(LOGITS, temperature))


@pytest.mark.parametrize(
    "params",
    [
        {"top_k": 3},
        {"top_k": 1},
        {"top_p": 0.6},
        {"top_p": 0.9, "temperature": 0.7},
        {"min_p": 0.3},
        {"top_k": 5, "top_p": 0.8, "min_p": 0.2, "temperature": 1.3},
    ],
)
def test_filters_match_a_direct_computation(params: dict) -> None:
    freq = frequencies(LOGITS, request(**params))
    assert_matches(freq, reference_probs(LOGITS, **params))


def test_top_p_wider_than_the_first_look() -> None:
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=3000) * 0.5).astype(np.float32)  # flat: the nucleus holds ~1000 tokens
    expected = reference_probs(logits, top_p=0.5)
    assert (expected > 0).sum() > 500  # far wider than the first look at 64 tokens
    draws = 1500
    out = Sampler(frozenset()).sample(np.tile(logits, (draws, 1)), [request(top_p=0.5)] * draws)
    assert np.all(expected[out.token_ids] > 0), "a token outside the nucleus was drawn"
    # compare masses over 10 buckets of tokens, best to worst (per-token counts are too small)
    buckets = np.array_split(np.argsort(-expected)[: (expected > 0).sum()], 10)
    freq = np.bincount(out.token_ids, minlength=len(logits)) / draws
    np.testing.assert_allclose(
        [freq[b].sum() for b in buckets], [expected[b].sum() for b in buckets], atol=0.04
    )


def test_rows_with_different_filters_in_one_batch() -> None:
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 4096)).astype(np.float32) * 3
    reqs = [request("a", top_k=2), request("b", top_k=40, top_p=0.5), request("c", min_p=0.5)]
    sampler = Sampler(frozenset())
    for _ in range(20):
        out = sampler.sample(logits, reqs)
        for row, (token, kwargs) in enumerate(
            zip(out.token_ids, [{"top_k": 2}, {"top_k": 40, "top_p": 0.5}, {"min_p": 0.5}], strict=True)
        ):
            assert reference_probs(logits[row], **kwargs)[token] > 0


def test_repetition_penalty_is_hf_style_over_prompt_and_output() -> None:
    req = request(prompt=(0, 3), output=(4,), repetition_penalty=2.0)
    expected_logits = LOGITS.astype(np.float64)
    expected_logits[0] /= 2.0  # positive: divided
    expected_logits[3] /= 2.0
    expected_logits[4] *= 2.0  # negative: multiplied
    assert_matches(frequencies(LOGITS, req), softmax(expected_logits))


def test_frequency_and_presence_penalties_are_openai_style_over_output() -> None:
    req = request(prompt=(1,), output=(0, 0, 0, 2), frequency_penalty=0.5, presence_penalty=0.25)
    expected_logits = LOGITS.astype(np.float64)
    expected_logits[0] -= 3 * 0.5 + 0.25
    expected_logits[2] -= 1 * 0.5 + 0.25  # token 1 is only in the prompt: untouched
    assert_matches(frequencies(LOGITS, req), softmax(expected_logits))


def test_penalties_apply_before_greedy() -> None:
    logits = np.array([[2.0, 1.9, 0.0]], dtype=np.float32)
    out = Sampler(frozenset()).sample(
        logits, [request(output=(0, 0), temperature=0.0, frequency_penalty=0.1)]
    )
    assert out.token_ids == [1]


def test_min_tokens_bans_eos_and_stop_ids_until_reached() -> None:
    logits = np.full((1, 10), -5.0, dtype=np.float32)
    logits[0, EOS] = 10.0
    logits[0, 3] = 9.0
    logits[0, 5] = 1.0
    sampler = Sampler(frozenset({EOS}))
    early = request(output=(1,), temperature=0.0, min_tokens=3, stop_token_ids=[3])
    assert sampler.sample(logits, [early]).token_ids == [5]
    done = request(output=(1, 1, 1), temperature=0.0, min_tokens=3, stop_token_ids=[3])
    assert sampler.sample(logits, [done]).token_ids == [EOS]


def test_seed_reproducible_and_independent_of_the_batch() -> None:
    rng = np.random.default_rng(3)
    steps = [rng.normal(size=(1, 64)).astype(np.float32) for _ in range(6)]

    def run(batch_before: int, batch_after: int, rid: str) -> list[int]:
        sampler = Sampler(frozenset(), default_seed=batch_before)
        target = request(rid, seed=1234)
        tokens = []
        for logits in steps:
            others_before = [request(f"x{i}") for i in range(batch_before)]
            others_after = [request(f"y{i}", seed=i) for i in range(batch_after)]
            batch = np.concatenate(
                [rng.normal(size=(batch_before, 64)), logits, rng.normal(size=(batch_after, 64))]
            ).astype(np.float32)
            out = sampler.sample(batch, [*others_before, target, *others_after])
            tokens.append(out.token_ids[batch_before])
        return tokens

    alone = run(0, 0, "a")
    assert run(3, 2, "b") == alone
    assert run(1, 5, "c") == alone
    assert len(set(alone)) > 1  # really sampled


def test_forget_restarts_a_seeded_stream() -> None:
    logits = np.tile(LOGITS, (1, 1))
    sampler = Sampler(frozenset())
    first = [sampler.sample(logits, [request("a", seed=9)]).token_ids[0] for _ in range(8)]
    sampler.forget("a")
    again = [sampler.sample(logits, [request("a", seed=9)]).token_ids[0] for _ in range(8)]
    assert first == again


def test_logprobs_come_from_the_raw_logits() -> None:
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(3, 50)).astype(np.float32) * 4
    reqs = [
        request("a", temperature=0.0, logprobs=5, repetition_penalty=1.5),
        request("b", temperature=0.3, logprobs=0),
        request("c", temperature=0.0),
    ]
    out = Sampler(frozenset()).sample(logits, reqs)
    for row in range(2):
        reference = np.log(softmax(logits[row]))
        entry = out.logprobs[row]
        assert entry.token_id == out.token_ids[row]
        assert entry.logprob == pytest.approx(reference[entry.token_id], abs=1e-5)
        best = np.argsort(-reference, kind="stable")[: reqs[row].sampling_params.logprobs]
        assert [t for t, _ in entry.top] == best.tolist()
        np.testing.assert_allclose([lp for _, lp in entry.top], reference[best], atol=1e-5)
    assert out.logprobs[1].top == ()
    assert out.logprobs[2] is None


def test_large_vocabulary_batch() -> None:
    rng = np.random.default_rng(5)
    vocab = 262_144
    logits = (rng.standard_normal((6, vocab), dtype=np.float32) * 2).astype(np.float32)
    reqs = [
        request("g", temperature=0.0, logprobs=20),
        request("t", temperature=0.8),
        request("k", top_k=50, logprobs=3),
        request("p", top_p=0.9, temperature=0.5),
        request("kp", top_k=100, top_p=0.5, seed=1),
        request("m", min_p=0.2, presence_penalty=1.0, output=(5, 6)),
    ]
    out = Sampler(frozenset()).sample(logits, reqs)
    assert out.token_ids[0] == int(np.argmax(logits[0]))
    assert out.token_ids[2] in set(np.argsort(-logits[2])[:50].tolist())
    assert out.token_ids[4] in set(np.argsort(-logits[4])[:100].tolist())
    assert logits[5, out.token_ids[5]] >= logits[5].max() + np.log(0.2) - 1e-5
    assert [t for t, _ in out.logprobs[0].top] == np.argsort(-logits[0])[:20].tolist()


def test_bad_input_is_named() -> None:
    sampler = Sampler(frozenset())
    with pytest.raises(ValueError, match=r"logits must be \[batch=2, vocab\]"):
        sampler.sample(np.zeros((1, 4), dtype=np.float32), [request(), request()])
    with pytest.raises(ValueError, match="'bad' have no finite value"):
        sampler.sample(np.full((1, 4), -np.inf, dtype=np.float32), [request("bad")])


def test_small_vocabulary_edges() -> None:
    logits = np.array([[0.5, 2.0, 1.0]], dtype=np.float32)
    req = request(temperature=0.0, logprobs=20, min_tokens=1, stop_token_ids=[99])
    out = Sampler(frozenset({1000})).sample(logits, [req])
    assert out.token_ids == [1]
    assert [t for t, _ in out.logprobs[0].top] == [1, 2, 0]  # all three, best first
