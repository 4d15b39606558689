"""One step of look-ahead in decode: launch step N+1 before reading step N's sampled ids.

While step N runs on the GPU, the engine schedules N+1 and launches it with N's sampled ids as
its input ids, taken on the device; only then does it wait for N's ids (copied to the host
behind N's kernels) and do N's host work (stop checks, detokenizing, outputs) while N+1 runs.
The GPU no longer idles through the host's part of every step (vLLM's async scheduling,
SGLang's overlap scheduler).

Placeholders: a step that goes in flight is recorded at once with `scheduler.update()`, with
PLACEHOLDER for each sampled token, so the next `schedule()` sees each request one token
further. A placeholder is always its request's last token and never has KV
(`num_computed_tokens` stops before it), so the prefix cache, which takes only full blocks within
`num_computed_tokens`, never holds one; host paths that read token ids assert they meet none
(`runner.token_slice`): the engine resolves the step in flight before any step but a look-ahead.

A request that stops at step N still has a row in N+1. Its ids are dropped: N+1 is recorded
(`update()`) only after N was resolved, and update skips requests no longer running. That row
wrote the KV of N's last token into a block the request held until its finish freed it; the
block lies past `num_computed_tokens`, so it is not cached, and whoever gets it next writes it
in a later step, queued on the same stream behind that write.

Only rows that need nothing more from the host go in flight (`sampler.deferrable`): penalties
need the token history, logprobs the logits buffer that the next replay overwrites.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engine.core.scheduler import Scheduler, SchedulerOutput
from app.engine.request import PLACEHOLDER, Request, RequestStatus
from app.engine.sample.sampler import deferrable


@dataclass
class InFlight:
    """A launched step whose sampled ids the host has not read yet."""

    requests: list[Request]  # the sampling rows, in the sampler's order
    slots: list[int | None]  # each row's placeholder in `output_token_ids`; None: it had ended
    pending: Any  # the sampler's launched sample: `device_ids`, `resolve()`


class DecodePipeline:
    def __init__(self, scheduler: Scheduler, decodes_from_device: Callable[[int], bool]) -> None:
        self.scheduler = scheduler
        self.decodes_from_device = decodes_from_device  # runner: can a look-ahead step of n rows run?
        self.in_flight: InFlight | None = None

    def launched(self, scheduled: SchedulerOutput, requests: list[Request], pending: Any) -> None:
        """Step `scheduled` runs and `pending` samples `requests` (its sampling rows): record the
        step with a placeholder for each sampled token and keep it in flight."""
        assert self.in_flight is None, "one step in flight at most"
        self.scheduler.update(scheduled, dict.fromkeys((r.request_id for r in requests), PLACEHOLDER))
        slots = [len(r.output_token_ids) - 1 if self._live(r) else None for r in requests]
        assert all(
            s is None or r.output_token_ids[s] == PLACEHOLDER for r, s in zip(requests, slots, strict=True)
        )
        self.in_flight = InFlight(requests, slots, pending)

    def can_look_ahead(self) -> bool:
        """Whether the next `schedule()` is certain to give one decode to each running request and
        nothing else, all of which may go in flight. Read-only (`schedule()` is not: it allocates
        and preempts): no request waits; each running one was sampled by the step in flight, may
        be deferred, is below its length limits after that step's token, and the free KV blocks
        cover every new block the decodes need, so nothing is preempted."""
        flight, scheduler = self.in_flight, self.scheduler
        running = scheduler.running
        if (
            flight is None
            or not running
            or scheduler.num_waiting
            or not self.decodes_from_device(len(running))
        ):
            return False
        sampled = {id(r) for r, slot in zip(flight.requests, flight.slots, strict=True) if slot is not None}
        max_model_len, kv = scheduler.config.max_model_len, scheduler.kv
        new_blocks = 0
        for request in running:
            max_tokens = request.sampling_params.max_tokens
            if (
                id(request) not in sampled
                or request.num_pending_tokens != 1
                or not deferrable(request)
                or request.num_tokens >= max_model_len
                or (max_tokens is not None and request.num_output_tokens >= max_tokens)
            ):
                return False
            new_blocks += kv.new_blocks_needed(request, 1)
        return new_blocks <= kv.num_free_blocks

    def planned(self, scheduled: SchedulerOutput) -> list[Request]:
        """The rows of a look-ahead step, checked against what `can_look_ahead` promised."""
        chunks = scheduled.chunks
        assert not scheduled.preempted and not scheduled.finished, "a look-ahead step preempted"
        assert len(chunks) == self.scheduler.num_running, "a look-ahead step left a request out"
        assert all(c.num_tokens == 1 and c.samples for c in chunks), "a look-ahead step is not all decodes"
        return [c.request for c in chunks]

    def inputs(self, requests: list[Request]) -> tuple[Any, np.ndarray | None]:
        """A look-ahead step's input ids: the in-flight step's sampled ids on the device, and each
        request's row among them (the orders can differ; None when request i is row i)."""
        assert self.in_flight is not None
        index = {id(r): i for i, r in enumerate(self.in_flight.requests)}
        rows = [index[id(r)] for r in requests]
        gather = None if rows == list(range(len(rows))) else np.asarray(rows, dtype=np.int64)
        return self.in_flight.pending.device_ids, gather

    def resolve(self) -> tuple[list[Request], list[int]]:
        """Wait for the in-flight step's ids and write them over its placeholders; the requests
        still live and their new tokens (rows of requests finished or aborted meanwhile are
        dropped). Nothing is in flight afterwards, even if the wait fails."""
        flight, self.in_flight = self.in_flight, None
        assert flight is not None, "nothing in flight"
        sampled = flight.pending.resolve().token_ids
        requests, token_ids = [], []
        for request, slot, token_id in zip(flight.requests, flight.slots, sampled, strict=True):
            if slot is None or self.scheduler.get(request.request_id) is not request:
                continue
            assert request.status == RequestStatus.RUNNING, (
                f"{request.request_id}: a placeholder outlived RUNNING"
            )
            assert request.output_token_ids[slot] == PLACEHOLDER
            request.output_token_ids[slot] = token_id
            requests.append(request)
            token_ids.append(token_id)
        return requests, token_ids

    def _live(self, request: Request) -> bool:
        return request.status == RequestStatus.RUNNING and self.scheduler.get(request.request_id) is request
