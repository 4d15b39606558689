"""Who drafts, and how many tokens: per request from its recent acceptance, and off for large batches.

k adapts per request: all drafts accepted -> one more next time (up to `max_k`), some rejected ->
one more than were accepted (at least `min_k`). A request whose recent acceptance rate (an
exponential average over its verify steps) falls below `min_acceptance` stops drafting for
`pause_steps` decode steps, then tries again: a verify step costs more than a decode step, so drafts
that are mostly wrong slow the request down. With more than `max_batch` running requests no one
drafts: the batch already keeps the device busy, and verify rows would crowd out other decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.request import Request

EMA = 0.7  # weight of the past in the acceptance average


@dataclass
class _State:
    k: int
    acceptance: float = 1.0  # optimistic until measured
    paused: int = 0  # decode steps left without drafting


class SpecPolicy:
    def __init__(
        self, max_k: int = 8, min_k: int = 2, max_batch: int = 4, min_acceptance: float = 0.15, pause_steps: int = 8
    ) -> None:
        if not 1 <= min_k <= max_k:
            raise ValueError(f"draft tokens need 1 <= min_k <= max_k, got {min_k} and {max_k}")
        if max_batch < 1:
            raise ValueError(f"speculative max batch must be at least 1, got {max_batch}")
        self.max_k, self.min_k, self.max_batch = max_k, min_k, max_batch
        self.min_acceptance, self.pause_steps = min_acceptance, pause_steps
        self._states: dict[str, _State] = {}

    def wanted(self, request: Request, batch: int) -> int:
        """Drafts to ask for this step (0: none)."""
        if batch > self.max_batch:
            return 0
        state = self._state(request)
        if state.paused:
            state.paused -= 1
            return 0
        return state.k

    def record(self, request: Request, drafted: int, accepted: int) -> None:
        """A verify step's outcome for `request`."""
        if drafted < 1:
            return
        state = self._state(request)
        state.k = min(self.max_k, state.k + 1) if accepted == drafted else max(self.min_k, accepted + 1)
        state.acceptance = EMA * state.acceptance + (1 - EMA) * accepted / drafted
        if state.acceptance < self.min_acceptance:
            state.paused, state.acceptance = self.pause_steps, self.min_acceptance  # retry at the threshold

    def forget(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def _state(self, request: Request) -> _State:
        state = self._states.get(request.request_id)
        if state is None:
            state = self._states[request.request_id] = _State(k=self.max_k)
        return state
