"""The engine's speculative decoding: which requests draft this step, how many tokens, and the outcome
of each verify step (counted per request and fed back to the policy)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from app.engine.request import Request
from app.engine.spec.ngram import NgramDrafter
from app.engine.spec.policy import SpecPolicy
from app.engine.spec.verify import accepted_tokens

METHODS = ("off", "ngram", "draft", "mtp")


class Drafter(Protocol):
    """What proposes drafts: prompt lookup (spec/ngram.py), a draft model (core/draft_model.py, a
    floor above: it runs a model of its own) or the model's MTP head (core/mtp_drafter.py: it also has
    `propose_for(request, k)`, taken instead, since it drafts from the request's hidden states)."""

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens likely to follow `tokens` (a request's prompt and output so far)."""
        ...


class Speculator:
    def __init__(self, drafter: Drafter, policy: SpecPolicy, may_draft: Callable[[Request], bool]) -> None:
        self.drafter = drafter
        self.policy = policy
        self.may_draft = may_draft  # the sampler's say: rows whose tokens need no per-token host state
        self.drafted = 0  # totals since start, for /metrics
        self.accepted = 0

    def active(self, running: Sequence[Request]) -> bool:
        """Whether some running request may draft at this batch size (its steps then stay synchronous:
        a draft needs the last token on the host)."""
        return len(running) <= self.policy.max_batch and any(self.may_draft(r) for r in running)

    def propose(self, running: Sequence[Request], max_model_len: int) -> None:
        """Set `draft_token_ids` on each decoding request that drafts this step (one with several pending
        tokens past its prompt, a hybrid model's rolled-back verify step, drafts after them)."""
        for request in running:
            if request.num_computed_tokens < request.num_prompt_tokens or not self.may_draft(request):
                continue
            k = min(self.policy.wanted(request, len(running)), room(request, max_model_len))
            if k > 0:
                propose_for = getattr(self.drafter, "propose_for", None)
                request.draft_token_ids = (propose_for(request, k) if propose_for is not None
                                           else self.drafter.propose(request.all_token_ids, k))  # fmt: skip

    def verify(self, request: Request, drafts: Sequence[int], sampled: Sequence[int]) -> list[int]:
        """The tokens a verify step emits for `request` (spec/verify.py), counted."""
        emitted = accepted_tokens(drafts, sampled)
        accepted = len(emitted) - 1
        request.num_draft_tokens += len(drafts)
        request.num_accepted_tokens += accepted
        self.drafted += len(drafts)
        self.accepted += accepted
        self.policy.record(request, len(drafts), accepted)
        return emitted

    def forget(self, request_id: str) -> None:
        self.policy.forget(request_id)
        forget = getattr(self.drafter, "forget", None)  # a drafter with per-request state (MTP)
        if forget is not None:
            forget(request_id)


def room(request: Request, max_model_len: int) -> int:
    """Most drafts a request can take: a verify step emits up to k+1 tokens, within max_tokens and the
    context."""
    limit = max_model_len - request.num_tokens - 1
    max_tokens = request.sampling_params.max_tokens
    if max_tokens is not None:
        limit = min(limit, max_tokens - request.num_output_tokens - 1)
    return max(0, limit)


def build_speculator(method: str, num_draft_tokens: int, max_batch: int, may_draft: Callable[[Request], bool],
                     drafter: Drafter | None = None) -> Speculator | None:  # fmt: skip
    """The speculator for `--speculative METHOD` (None: off); "draft" and "mtp" take their loaded
    drafter (core/draft_model.py, core/mtp_drafter.py)."""
    if method not in METHODS:
        raise ValueError(f"speculative must be one of {', '.join(METHODS)}, not {method!r}")
    if method == "off":
        return None
    if method in ("draft", "mtp") and drafter is None:
        raise ValueError(f"speculative {method} needs its drafter (core/draft_model.py, core/mtp_drafter.py)")
    policy = SpecPolicy(max_k=num_draft_tokens, min_k=min(2, num_draft_tokens), max_batch=max_batch)
    return Speculator(NgramDrafter() if method == "ngram" else drafter, policy, may_draft)
