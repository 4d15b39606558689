"""Verification of drafted tokens from the target model's samples at every drafted position.

The drafters here are deterministic (a point-mass proposal q = 1[x = draft]). For such a proposal,
the rejection-sampling rule (Leviathan et al. 2023, Chen et al. 2023: accept x with probability
min(1, p(x)/q(x)), else draw from norm(max(0, p - q))) is: accept the draft with probability p(draft),
and on rejection draw from p with the draft removed, renormalised. Drawing y ~ p at that position and
accepting iff y == draft does exactly that: P(accept) = p(draft), and given y != draft, y is p
conditioned on not being the draft. So the verifier samples each of the k+1 positions with the
ordinary sampler (the very distribution decoding without drafts samples from: temperature, top-k,
top-p, min-p all apply; greedy rows take the argmax), accepts the longest prefix of drafts equal
to those samples, and the sample at the first mismatch (or after the last draft: the bonus token)
is the next token. Every emitted token is a draw from the target's own distribution given the
tokens before it.
"""

from __future__ import annotations

from collections.abc import Sequence


def accepted_tokens(drafts: Sequence[int], sampled: Sequence[int]) -> list[int]:
    """The tokens a verify step emits: the drafts the target's samples agree with, then the target's
    sample at the first disagreement (or its bonus sample after the last draft). `sampled[j]` is the
    target's sample at draft position j (len(drafts) + 1 of them)."""
    if len(sampled) != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} samples, got {len(sampled)}")
    n = 0
    while n < len(drafts) and drafts[n] == sampled[n]:
        n += 1
    return list(sampled[: n + 1])
