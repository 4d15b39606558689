"""Which tokens of which requests the next step processes. Integers only: no arrays, no device.

Unified token rule: a request's pending tokens are `num_tokens - num_computed_tokens`
(the rest of the prompt, the one sampled token still without KV, or everything again
after a preemption). A chunk covering all of them also samples the next token.

Policy of one `schedule()` call, under a budget of `max_num_batched_tokens` tokens:

1. Decodes first: every running request with exactly one pending token gets it, oldest
   admission first; then a hybrid model's prompt tails (less than a block left after a snapshot
   cut at the prompt's last block boundary: the chunk that samples the first token), oldest first.
2. Prefill, round-robin over sessions (`request.session_id`): sessions take turns, and
   the session served longest ago goes first (a session that was never served goes
   before all others). On its turn a session continues its oldest running, partly
   prefilled request (a request keeps its place once admitted: chunked prefill), or,
   when it has none, admits the head of its waiting queue (FIFO within a session) if
   fewer than `max_num_seqs` requests run. A chunk is as many pending tokens as the
   budget allows. Turns go on until the budget is spent or nobody can use it; so one
   session's 50 queued requests cannot keep another session's single request waiting.
   When every seat (`max_num_seqs`) is taken, a session waiting with nothing running gets one
   at the start of the step: the session holding the most seats gives up its newest request
   (preempted for recompute, see below), so a flood cannot hold every seat until it ends.
3. Pacing (`limit`, core/step_pacing.py, `decode_latency_factor`): in a step that carries decodes, each
   prefill chunk (running or admitted) is also cut to what `limit.tokens(start)` allows, rounded down to
   end on a block boundary, so the decoders' step stays within a bound on their inter-token latency; the
   step's first prefill chunk takes at least `min_paced_chunk` tokens whatever the limit says (a long
   prompt always progresses), one that starts at an image takes the whole image, and once the limit
   allows nothing the step takes no more prefill. A step without decodes takes the whole budget.
4. Admission reuses cached prefix blocks (`KVCacheManager.match_prefix`) and must get
   blocks for its whole first chunk; if it cannot, admission stops for this step (no
   queue-jumping by smaller requests, so large ones are not starved). Admission never
   preempts for blocks, and no admission happens in a step that preempted for blocks.

Out of KV blocks for a running request: the most recently admitted running request not
yet scheduled in this step is preempted (recompute): its blocks are freed (their full
prefix goes to the prefix cache, so the recompute is often a cache hit), its
`num_computed_tokens` returns to 0 and it goes back to the front of its session's
queue. When nothing else can give way the request preempts itself; one that could not
fit even into an empty cache is finished instead (reported in `finished`), so no
request can stall the loop forever.

Hybrid models (`kv.state`, cache/state_cache.py): admission also needs a free state slot (there
are `max_num_seqs`), a preempted request gives its slot up and later resumes from a state
snapshot or from zero, prefill chunks are cut to end at the state cache's snapshot points, and
the step's state copies (restores before the forward, snapshot saves after) ride in the output.

Speculative decoding (app/engine/spec/): a decoding request may carry drafted tokens
(`request.draft_token_ids`, set by the engine before `schedule()`). Its decode chunk then covers
the last sampled token and the drafts, k+1 tokens that all sample (after a hybrid rollback: all its
pending tokens, then the drafts, whose k+1 rows sample); fewer drafts when the budget or the free
blocks are short. `update()` advances such a request past the tokens the verifier
accepted only (rejected drafts' KV lies past `num_computed_tokens`: never cached, overwritten later)
and leaves appending the emitted tokens to the engine, which stop-checks them one by one. On a
hybrid model the recurrent layers cannot drop rejected drafts: a verify chunk checkpoints its
state slot first, and one that kept fewer tokens than it ran is rolled back to that checkpoint
and not advanced at all, so its kept tokens are recomputed as a chunk of the next step
(cache/state_cache.py: `rollback`).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from app.engine.cache.manager import KVCacheManager
from app.engine.cache.state_cache import StateCopies
from app.engine.request import Request, RequestStatus

MIN_PACED_CHUNK = 64  # a paced step's first prefill chunk takes at least this many tokens (module docstring, 3)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    enable_prefix_caching: bool = True
    # pacing: the fewest prefill tokens a step with decodes takes, whatever its limit (module docstring, 3)
    min_paced_chunk: int = MIN_PACED_CHUNK

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "min_paced_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # otherwise the decodes of a full batch would not fit one step's budget
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs})"
            )


class PrefillLimit(Protocol):
    """A step's prefill allowance while requests decode (core/step_pacing.py's `PrefillBudget`): integers
    in and out, so the scheduler stays free of clocks and costs."""

    def tokens(self, start: int) -> int:
        """The most tokens a prefill chunk from position `start` may take now."""
        ...

    def take(self, start: int, num_tokens: int) -> None:
        """A prefill chunk of `num_tokens` from `start` was scheduled."""
        ...


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens `request.all_token_ids[start:start + num_tokens]` are processed this step.

    `start` equals `num_computed_tokens` at schedule time; `samples` is true when the
    chunk reaches the end of the known tokens, so the step samples the next one. A decode with
    drafts: its last `len(draft_token_ids)` tokens are the drafts (not in `all_token_ids`), and
    every one of its tokens samples (a verify chunk).
    """

    request: Request
    start: int
    num_tokens: int
    samples: bool
    draft_token_ids: tuple[int, ...] = ()

    @property
    def num_sampled_rows(self) -> int:
        """Logit rows this chunk returns: one per drafted token and one after them, or 0/1."""
        return len(self.draft_token_ids) + 1 if self.draft_token_ids else int(self.samples)


@dataclass(frozen=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk]  # decodes first, then prefill chunks
    num_tokens: int
    preempted: list[Request]
    finished: list[Request] = field(default_factory=list)  # ended here: they can never fit in the KV cache
    # hybrid models: the recurrent-state row copies the runner does around the forward (prefix
    # hits' snapshots into their slots, new snapshots out of them; cache/state_cache.py)
    state: StateCopies = field(default_factory=StateCopies)
    num_decodes: int = 0  # the first chunks: one per decoding request (its drafts with it)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


class _SessionTurns:
    """Round-robin memory: the session served longest ago comes first."""

    def __init__(self) -> None:
        self._last_served: dict[str, int] = {}
        self._tick = 0

    def order(self, sessions: Iterable[str]) -> list[str]:
        # sorted() is stable: sessions never served keep the order they were given in
        return sorted(sessions, key=lambda session: self._last_served.get(session, -1))

    def served(self, session: str) -> None:
        self._tick += 1
        self._last_served[session] = self._tick

    def forget(self, session: str) -> None:
        self._last_served.pop(session, None)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        if kv.block_size != config.block_size:
            raise ValueError(
                f"KV cache block_size {kv.block_size} != scheduler block_size {config.block_size}"
            )
        if config.enable_prefix_caching != (kv.prefix_cache is not None):
            raise ValueError(
                "enable_prefix_caching differs between the scheduler config and the KV cache manager"
            )
        self.config = config
        self.kv = kv
        self._requests: dict[str, Request] = {}
        self._waiting: dict[str, deque[Request]] = {}  # session -> FIFO queue (insertion order = first seen)
        self._running: list[Request] = []  # admission order: the last one is preempted first
        self._turns = _SessionTurns()
        self._live_per_session: Counter[str] = Counter()
        self.num_preemptions = 0  # since start, for /metrics

    # --- queries ---

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._requests) - len(self._running)

    def get(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    @property
    def running(self) -> tuple[Request, ...]:
        return tuple(self._running)

    # --- lifecycle ---

    def add(self, request: Request) -> None:
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already scheduled")
        if request.num_prompt_tokens < 1:
            raise ValueError(f"request {request.request_id!r} has an empty prompt")
        if request.num_tokens > self.config.max_model_len:
            raise ValueError(
                f"request {request.request_id!r} has {request.num_tokens} tokens, "
                f"more than max_model_len {self.config.max_model_len}"
            )
        if self.kv.blocks_needed(request.num_tokens) > self.kv.capacity:
            raise ValueError(
                f"request {request.request_id!r} needs {self.kv.blocks_needed(request.num_tokens)} KV blocks; "
                f"the cache has {self.kv.capacity}"
            )
        request.status = RequestStatus.WAITING
        self._requests[request.request_id] = request
        self._waiting.setdefault(request.session_id, deque()).append(request)
        self._live_per_session[request.session_id] += 1

    def finish(self, request: Request, status: RequestStatus) -> None:
        """End a request: free its blocks (caching their full prefix) and forget it."""
        if not status.finished:
            raise ValueError(f"finish needs a finished status, got {status}")
        if self._requests.pop(request.request_id, None) is None:
            return
        if request.status == RequestStatus.RUNNING:
            self._running.remove(request)
        else:
            queue = self._waiting[request.session_id]
            queue.remove(request)
            if not queue:
                del self._waiting[request.session_id]
        self.kv.free(request)
        request.status = status
        self._live_per_session[request.session_id] -= 1
        if not self._live_per_session[request.session_id]:
            del self._live_per_session[request.session_id]
            self._turns.forget(request.session_id)

    def abort(self, request_id: str) -> Request | None:
        request = self._requests.get(request_id)
        if request is not None:
            self.finish(request, RequestStatus.FINISHED_ABORTED)
        return request

    # --- the step ---

    def schedule(self, limit: PrefillLimit | None = None) -> SchedulerOutput:
        """The next step's chunks; `limit` paces its prefill while requests decode (module docstring, 3)."""
        step = _Step(self.config.max_num_batched_tokens)
        self._free_seats_for_waiting_sessions(step)
        # decodes, then prompt tails (so a full batch's decodes always fit the budget)
        for tails in (False, True):
            for request in list(self._running):
                if step.budget == 0:
                    break
                if request.status != RequestStatus.RUNNING or request.request_id in step.scheduled:
                    continue
                if self._is_prompt_tail(request) if tails else request.num_pending_tokens == 1:
                    self._schedule_running(request, step, takes_turn=False)
            if not tails:
                step.num_decodes = len(step.chunks)
        if limit is not None and step.num_decodes:
            step.limit = limit
            for chunk in step.chunks[step.num_decodes :]:  # the prompt tails count against it too
                limit.take(chunk.start, chunk.num_tokens)
        self._schedule_prefills(step)
        for request in self._running:
            request.draft_token_ids = []  # used by this step's chunk or not at all
        copies = self.kv.state.take_copies() if self.kv.state is not None else StateCopies()
        return SchedulerOutput(step.chunks, sum(c.num_tokens for c in step.chunks), step.preempted, step.finished,
                               copies, step.num_decodes)  # fmt: skip

    def update(self, output: SchedulerOutput, sampled: dict[str, int | list[int]]) -> None:
        """Record a finished step: advance `num_computed_tokens`, append sampled tokens.

        A verify chunk's value is the list of tokens it emits (accepted drafts, then the target's
        own token): only the last sampled token and the accepted drafts count as computed, and the
        engine appends the emitted tokens itself. Chunks of requests finished or aborted since
        `schedule()` are skipped.
        """
        now = time.monotonic()
        for chunk in output.chunks:
            request = chunk.request
            if (
                request.status != RequestStatus.RUNNING
                or self._requests.get(request.request_id) is not request
            ):
                continue
            assert request.num_computed_tokens == chunk.start, "update() out of step with schedule()"
            if chunk.draft_token_ids:
                emitted = sampled[request.request_id]
                drafted = len(chunk.draft_token_ids)
                assert isinstance(emitted, list) and 1 <= len(emitted) <= drafted + 1
                if self.kv.state is not None and len(emitted) <= drafted:
                    self.kv.state.rollback(request)  # recomputed from the checkpoint: not advanced
                else:  # the chunk's own tokens (the last sampled one, or all a rollback left) + the accepted drafts
                    request.num_computed_tokens += chunk.num_tokens - drafted - 1 + len(emitted)
                continue
            request.num_computed_tokens += chunk.num_tokens
            if self.kv.state is not None:
                self.kv.state.step_done(request)
            if not chunk.samples:
                continue
            if request.request_id not in sampled:
                raise ValueError(f"no sampled token for request {request.request_id!r}, whose chunk samples")
            token = sampled[request.request_id]
            assert isinstance(token, int), "a list of tokens for a chunk without drafts"
            request.output_token_ids.append(token)
            if request.first_token_time is None:
                request.first_token_time = now
            assert request.num_tokens <= self.config.max_model_len, (
                f"request {request.request_id!r} grew past max_model_len: the engine must stop it"
            )

    def check_integrity(self) -> None:
        """Assert queue invariants and the KV cache's own (call when idle and in tests)."""
        waiting = [r for queue in self._waiting.values() for r in queue]
        assert all(queue for queue in self._waiting.values()), "an empty session queue was kept"
        assert len(waiting) + len(self._running) == len(self._requests), "a request is lost or queued twice"
        assert len(self._running) <= self.config.max_num_seqs
        for request in self._running:
            assert request.status == RequestStatus.RUNNING
            assert request.num_pending_tokens >= 1
            has_slot = request.state_slot is not None
            assert has_slot == (self.kv.state is not None), f"{request.request_id}: state slot {request.state_slot}"
        for request in waiting:
            assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert not request.block_ids and request.num_computed_tokens == 0
            assert request.state_slot is None, f"{request.request_id} waits holding a state slot"
        assert sum(self._live_per_session.values()) == len(self._requests)
        self.kv.check_integrity()

    # --- internals ---

    def _free_seats_for_waiting_sessions(self, step: _Step) -> None:
        """With every seat taken, each session that waits with nothing running gets one: the session
        holding the most seats (two at least) gives up its newest request (recompute; its computed
        prefix goes to the prefix cache, so that is mostly a cache hit later)."""
        if len(self._running) < self.config.max_num_seqs:
            return
        held = Counter(r.session_id for r in self._running)
        for session in self._turns.order([s for s in self._waiting if not held[s]]):
            if len(self._running) < self.config.max_num_seqs:
                break
            richest, seats = held.most_common(1)[0]
            if seats < 2:
                break
            victim = next(r for r in reversed(self._running) if r.session_id == richest)
            self._preempt(victim, step, out_of_blocks=False)
            held[richest] -= 1
            held[session] += 1  # its turn comes first in this step's prefills (served longest ago)

    def _schedule_prefills(self, step: _Step) -> None:
        """Hand out the rest of the budget in session turns (see the module docstring)."""
        own: dict[str, deque[Request]] = {}
        for request in self._running:
            if request.request_id not in step.scheduled:
                own.setdefault(request.session_id, deque()).append(request)
        sessions = self._turns.order(dict.fromkeys([*own, *self._waiting]))
        admitting = not step.out_of_blocks
        while step.budget > 0:
            progressed = False  # each round pops a running request or admits one: the loop ends
            for session in sessions:
                if step.budget == 0:
                    break
                queue = own.get(session)
                if queue:
                    request = queue.popleft()
                    if request.status == RequestStatus.RUNNING:  # else preempted meanwhile
                        self._schedule_running(request, step, takes_turn=True)
                        admitting = admitting and not step.out_of_blocks
                    progressed = True
                elif admitting and session in self._waiting:
                    admitting = self._admit(self._waiting[session][0], step)
                    progressed = progressed or admitting
            if not progressed:
                break

    def _is_prompt_tail(self, request: Request) -> bool:
        """A hybrid model's request whose prefill stopped at the last block boundary of its tokens (a
        snapshot point, cache/state_cache.py `chunk_tokens`) with less than a block left: the chunk that
        samples its first token. It goes with the decodes, before the turns, as on a dense model it would
        have finished in the step before: otherwise a wave of short prompts admits every newcomer (never
        served, so first in the turns) before any tail, and all first tokens wait for the last admission
        (32 prompts of 147 tokens, budget 2,048: 0, 0, 28 and 4 first tokens in steps 1-4; with tails
        first 0, 14, 13 and 5, against 13, 13 and 6 on a dense model). Four steps against three stay: a
        request's 144-token head and 3-token tail need two steps, and 32 heads (4,608 tokens) do not fit
        two budgets; only a snapshot saved from inside the chunk (the recurrent layers' state at a token of
        it, which their kernels do not return) would take the cut away."""
        if self.kv.state is None or not request.num_computed_tokens:
            return False
        size = self.config.block_size
        computed = request.num_computed_tokens
        return computed == request.num_tokens // size * size and request.num_pending_tokens < size

    def _schedule_running(self, request: Request, step: _Step, takes_turn: bool) -> None:
        """Give a running request a chunk of its pending tokens (a decode: and its drafts), unless it
        had to go."""
        drafts = request.draft_token_ids
        room = self._prefill_room(request, step) if takes_turn else step.budget
        if not room:
            return
        wanted = self._chunk_tokens(request, min(request.num_pending_tokens + len(drafts), room))
        granted = self._grow(request, wanted, step)
        if granted:
            self._add(request, granted, step, tuple(drafts[: max(0, granted - request.num_pending_tokens)]))
            if takes_turn:
                self._turns.served(request.session_id)

    def _admit(self, request: Request, step: _Step) -> bool:
        if len(self._running) >= self.config.max_num_seqs or not self.kv.can_admit():
            return False
        self.kv.match_prefix(request)
        room = self._prefill_room(request, step)
        num_tokens = self._chunk_tokens(request, min(request.num_pending_tokens, room))
        if not room or not self.kv.allocate(request, num_tokens):
            self.kv.free(request)
            request.num_computed_tokens = 0
            return False
        queue = self._waiting[request.session_id]
        queue.popleft()
        if not queue:
            del self._waiting[request.session_id]
        request.status = RequestStatus.RUNNING
        self._running.append(request)
        self._add(request, num_tokens, step)
        self._turns.served(request.session_id)
        return True

    def _prefill_room(self, request: Request, step: _Step) -> int:
        """The tokens a prefill chunk of `request` may take in this step: the budget, and in a paced step
        (module docstring, 3) what the limit allows from `num_computed_tokens`, rounded down to a block
        boundary; at least `min_paced_chunk` for the step's first prefill chunk, an image it starts at whole.
        0 closes the step's prefill."""
        if step.limit is None:
            return step.budget
        start, size = request.num_computed_tokens, self.config.block_size
        room = (start + step.limit.tokens(start)) // size * size - start
        if not step.num_prefills:
            room = max(room, self.config.min_paced_chunk)
        image = next((i for i in request.images if i.start == start), None)
        if image is not None:  # an image's tokens attend to each other both ways: one step
            room = max(room, image.end - start)
        room = max(0, min(room, step.budget))
        if not room:
            step.budget = 0  # its time is spent: no other session's chunk either
        return room

    def _chunk_tokens(self, request: Request, num_tokens: int) -> int:
        """A chunk of up to `num_tokens` from `num_computed_tokens`: not ending inside an image, and
        (hybrid models) ending at the next recurrent-state snapshot point."""
        start = request.num_computed_tokens
        num_tokens = request.chunk_before_image(start, num_tokens)
        if self.kv.state is not None:
            num_tokens = self.kv.state.chunk_tokens(request, start, num_tokens)
        return num_tokens

    def _add(self, request: Request, num_tokens: int, step: _Step, drafts: tuple[int, ...] = ()) -> None:
        start = request.num_computed_tokens
        chunk = step.add(request, num_tokens, drafts)
        if self.kv.state is not None:
            self.kv.state.plan_save(request, start, num_tokens, chunk.samples)
            if drafts:
                self.kv.state.plan_verify(request)

    def _grow(self, request: Request, wanted: int, step: _Step) -> int:
        """Allocate blocks for up to `wanted` more tokens, preempting later requests if needed.

        Returns the tokens granted (>= 1), or 0 when the request itself was preempted or
        finished because nothing else could give way.
        """
        size = self.config.block_size
        while True:
            room = (len(request.block_ids) + self.kv.num_free_blocks) * size - request.num_computed_tokens
            if room >= 1:
                granted = min(wanted, room)
                allocated = self.kv.allocate(request, granted)
                assert allocated, "allocation within the free room failed"
                return granted
            victim = next(
                (
                    r
                    for r in reversed(self._running)
                    if r is not request and r.request_id not in step.scheduled
                ),
                None,
            )
            if victim is not None:
                self._preempt(victim, step)
                continue
            if self.kv.blocks_needed(request.num_tokens) > self.kv.capacity:
                status = (
                    RequestStatus.FINISHED_LENGTH
                    if request.num_output_tokens
                    else RequestStatus.FINISHED_ABORTED
                )
                self.finish(request, status)
                step.finished.append(request)
            else:
                self._preempt(request, step)
            return 0

    def _preempt(self, request: Request, step: _Step, out_of_blocks: bool = True) -> None:
        """Send a running request back to wait (recompute); `out_of_blocks`: for KV blocks, which
        stops admissions in this step (a seat handed to a waiting session does not)."""
        self.num_preemptions += 1
        step.out_of_blocks = step.out_of_blocks or out_of_blocks
        self._running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.draft_token_ids = []
        request.status = RequestStatus.PREEMPTED
        self._waiting.setdefault(request.session_id, deque()).appendleft(request)
        step.preempted.append(request)


class _Step:
    """What one `schedule()` call has decided so far."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.chunks: list[ScheduledChunk] = []
        self.scheduled: set[str] = set()
        self.preempted: list[Request] = []
        self.out_of_blocks = False  # a preemption for KV blocks happened: no admissions in this step
        self.finished: list[Request] = []
        self.num_decodes = 0  # the first chunks, once the decode pass is over
        self.limit: PrefillLimit | None = None  # set when the step is paced: it carries decodes
        self.num_prefills = 0  # chunks scheduled after the decode pass (session turns)

    def add(self, request: Request, num_tokens: int, drafts: tuple[int, ...] = ()) -> ScheduledChunk:
        start = request.num_computed_tokens
        samples = start + num_tokens - len(drafts) == request.num_tokens
        chunk = ScheduledChunk(request, start, num_tokens, samples, drafts)
        self.chunks.append(chunk)
        self.scheduled.add(request.request_id)
        self.budget -= num_tokens
        if self.limit is not None:  # the decode pass is over: a prefill chunk of a paced step
            self.limit.take(start, num_tokens)
            self.num_prefills += 1
        return chunk
