from __future__ import annotations

import random
import zlib

import pytest

from app.engine.cache.manager import KVCacheManager
from app.engine.core.scheduler import PrefillLimit, Scheduler, SchedulerConfig, SchedulerOutput
from app.engine.request import Request, RequestStatus
from app.engine.sampling_params import SamplingParams

BS = 4


def make(
    num_blocks: int = 64, max_seqs: int = 4, budget: int = 32, max_len: int = 512, caching: bool = True
) -> Scheduler:
    kv = KVCacheManager(num_blocks, BS, enable_prefix_caching=caching)
    return Scheduler(SchedulerConfig(max_seqs, budget, max_len, BS, caching), kv)


def req(rid: str, prompt_len: int, session: str = "default", max_tokens: int = 4, first: int = 0) -> Request:
    prompt = [first + i for i in range(prompt_len)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens), session_id=session)


def next_token(tokens: list[int]) -> int:
    """A fake model: the next token depends only on all tokens so far, like a real one."""
    return zlib.crc32(repr(tokens).encode()) % 1000


def step(sched: Scheduler, limit: PrefillLimit | None = None) -> SchedulerOutput:
    """One engine step: schedule, 'run', sample, update, stop at max_tokens."""
    out = sched.schedule(limit)
    sampled = {c.request.request_id: next_token(c.request.all_token_ids) for c in out.chunks if c.samples}
    sched.update(out, sampled)
    for chunk in out.chunks:
        r = chunk.request
        if chunk.samples and r.num_output_tokens >= r.sampling_params.max_tokens:
            sched.finish(r, RequestStatus.FINISHED_LENGTH)
    sched.check_integrity()
    return out


def plan(out: SchedulerOutput) -> list[tuple[str, int, int, bool]]:
    return [(c.request.request_id, c.start, c.num_tokens, c.samples) for c in out.chunks]


def expected_output(prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


def test_config_and_add_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(4\) must be at least max_num_seqs \(8\)"):
        SchedulerConfig(8, 4, 64, BS)
    sched = make(num_blocks=5, max_len=64)
    with pytest.raises(ValueError, match="more than max_model_len 64"):
        sched.add(req("long", 65))
    with pytest.raises(ValueError, match="needs 5 KV blocks; the cache has 4"):
        sched.add(req("big", 17))
    with pytest.raises(ValueError, match="empty prompt"):
        sched.add(req("empty", 0))
    sched.add(req("a", 3))
    with pytest.raises(ValueError, match="'a' is already scheduled"):
        sched.add(req("a", 3))
    with pytest.raises(ValueError, match="block_size"):
        Scheduler(SchedulerConfig(4, 32, 64, 8), KVCacheManager(8, BS))


def test_chunked_prefill_splits_a_long_prompt() -> None:
    sched = make(budget=16)
    r = req("a", 50, max_tokens=2)
    sched.add(r)
    assert plan(step(sched)) == [("a", 0, 16, False)]
    assert plan(step(sched)) == [("a", 16, 16, False)]
    assert plan(step(sched)) == [("a", 32, 16, False)]
    assert plan(step(sched)) == [("a", 48, 2, True)]
    assert r.first_token_time is not None and r.num_output_tokens == 1
    assert plan(step(sched)) == [("a", 50, 1, True)]
    assert r.status == RequestStatus.FINISHED_LENGTH and not sched.has_unfinished()
    assert r.output_token_ids == expected_output(r.prompt_token_ids, 2)


def test_decodes_go_first_then_prefill_chunks_get_the_rest() -> None:
    sched = make(budget=16)
    sched.add(req("a", 5, max_tokens=10))
    sched.add(req("b", 6, max_tokens=10))
    assert plan(step(sched)) == [("a", 0, 5, True), ("b", 0, 6, True)]
    sched.add(req("c", 40, max_tokens=10))
    assert plan(step(sched)) == [("a", 5, 1, True), ("b", 6, 1, True), ("c", 0, 14, False)]
    assert plan(step(sched)) == [("a", 6, 1, True), ("b", 7, 1, True), ("c", 14, 14, False)]


def test_new_requests_join_the_running_batch() -> None:
    sched = make(max_seqs=2, budget=32)
    sched.add(req("a", 3, max_tokens=2))
    sched.add(req("b", 3, max_tokens=5))
    sched.add(req("c", 3, max_tokens=2))
    assert [c[0] for c in plan(step(sched))] == ["a", "b"]  # c waits for a seat
    assert sched.num_running == 2 and sched.num_waiting == 1
    assert [c[0] for c in plan(step(sched))] == ["a", "b"]  # a finishes here
    assert plan(step(sched)) == [("b", 4, 1, True), ("c", 0, 3, True)]  # c joins while b decodes


def test_one_sessions_queue_does_not_starve_another() -> None:
    sched = make(max_seqs=2, budget=64, num_blocks=256)
    for i in range(50):
        sched.add(req(f"flood-{i}", 8, session="flood", max_tokens=3))
    sched.add(req("single", 8, session="other", max_tokens=3))
    first = plan(step(sched))
    assert {c[0] for c in first} == {"flood-0", "single"}


def test_sessions_take_turns_at_the_prefill_budget() -> None:
    sched = make(max_seqs=4, budget=16, num_blocks=256)
    sched.add(req("a1", 200, session="a", max_tokens=1))
    sched.add(req("a2", 200, session="a", max_tokens=1))
    step(sched)  # a1 starts alone
    sched.add(req("b1", 200, session="b", max_tokens=1, first=1000))
    served: dict[str, int] = {"a": 0, "b": 0}
    for _ in range(10):
        for rid, _, n, _ in plan(step(sched)):
            served[rid[0]] += n
    assert served["a"] == served["b"] == 80  # the budget alternates between the two sessions
    # within session a, FIFO: a2 has not started while a1 is prefilling
    assert sched.get("a2").num_computed_tokens == 0


def test_budget_is_shared_within_a_round() -> None:
    sched = make(max_seqs=4, budget=16)
    sched.add(req("a", 5, session="a", max_tokens=3))
    sched.add(req("b", 5, session="b", max_tokens=3))
    sched.add(req("c", 30, session="c", max_tokens=3))
    assert plan(step(sched)) == [("a", 0, 5, True), ("b", 0, 5, True), ("c", 0, 6, False)]


def test_preemption_frees_the_newest_and_it_resumes() -> None:
    sched = make(num_blocks=7, budget=32)  # 6 usable blocks
    a, b = req("a", 8, max_tokens=10), req("b", 8, max_tokens=10, first=100)
    sched.add(a)
    sched.add(b)
    step(sched)  # both prompts: 2 blocks each, 2 blocks left
    preempted_at = None
    for i in range(30):
        out = step(sched)
        if out.preempted:
            assert out.preempted == [b] and b.status == RequestStatus.PREEMPTED
            assert b.num_computed_tokens == 0 and b.block_ids == []
            assert sched.num_waiting == 1
            preempted_at = i
            break
    assert preempted_at is not None
    while sched.has_unfinished():
        step(sched)
    for r in (a, b):
        assert r.status == RequestStatus.FINISHED_LENGTH
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 10)


def test_preempted_request_goes_to_the_front_of_its_session() -> None:
    sched = make(num_blocks=7, max_seqs=2, budget=32)
    sched.add(req("a", 8, max_tokens=10))
    sched.add(req("b", 8, max_tokens=10, first=100))
    sched.add(req("c", 4, max_tokens=1, first=200))
    while not (out := step(sched)).preempted:
        pass
    assert [r.request_id for r in out.preempted] == ["b"]
    assert plan(out) == [("a", out.chunks[0].start, 1, True)]  # nothing admitted in a preempting step
    assert step(sched).chunks[0].request.request_id == "a"
    while sched.get("a"):
        step(sched)
    assert [c[0] for c in plan(step(sched))] == ["b", "c"]  # b back at the front, before c


def test_recompute_after_preemption_hits_the_prefix_cache() -> None:
    sched = make(num_blocks=9, budget=64)  # 8 usable blocks
    a, b = req("a", 12, max_tokens=8), req("b", 12, max_tokens=20, first=100)
    sched.add(a)
    sched.add(b)
    while not (out := step(sched)).preempted:
        pass
    assert out.preempted == [b] and b.num_cached_tokens == 0
    assert sched.kv.num_cached_blocks >= 3  # b's computed full blocks went to the prefix cache
    resumed = []
    while not resumed:
        resumed = [c for c in step(sched).chunks if c.request is b]
    [resumed] = resumed
    assert resumed.start >= 12  # the recompute started after the cached blocks
    while sched.has_unfinished():
        step(sched)
    assert b.output_token_ids == expected_output(b.prompt_token_ids, 20)


def test_abort_frees_blocks_for_running_and_waiting() -> None:
    sched = make(max_seqs=1, caching=False)
    free_at_start = sched.kv.num_free_blocks
    sched.add(req("a", 20, max_tokens=10))
    sched.add(req("b", 20, max_tokens=10))
    step(sched)
    assert sched.kv.num_free_blocks < free_at_start
    assert sched.abort("a").status == RequestStatus.FINISHED_ABORTED
    assert sched.kv.num_free_blocks == free_at_start
    assert sched.abort("b").status == RequestStatus.FINISHED_ABORTED
    assert sched.abort("missing") is None
    assert not sched.has_unfinished() and sched.schedule().is_empty
    sched.check_integrity()


def test_abort_between_schedule_and_update_is_skipped() -> None:
    sched = make()
    sched.add(req("a", 5))
    out = sched.schedule()
    sched.abort("a")
    sched.update(out, {})
    sched.check_integrity()


def test_abort_with_prefix_caching_leaves_blocks_reusable() -> None:
    sched = make()
    sched.add(req("a", 20, max_tokens=10))
    step(sched)
    step(sched)
    sched.abort("a")
    assert sched.kv.num_used_blocks == 0 and sched.kv.num_cached_blocks == 5
    sched.add(again := req("again", 21, max_tokens=1))
    assert plan(step(sched)) == [("again", 20, 1, True)]
    assert again.num_cached_tokens == 20


def test_a_request_that_outgrows_the_cache_is_finished_not_looped() -> None:
    sched = make(num_blocks=5, max_len=64)  # 4 blocks: 16 tokens at most
    r = req("a", 10, max_tokens=40)
    sched.add(r)
    finished = []
    for _ in range(50):
        out = step(sched)
        finished += out.finished
        if not sched.has_unfinished():
            break
    assert finished == [r] and r.status == RequestStatus.FINISHED_LENGTH
    assert r.num_tokens == 17  # 16 tokens of KV plus the last sampled one


def test_update_checks_the_sampled_tokens() -> None:
    sched = make()
    sched.add(req("a", 5))
    out = sched.schedule()
    with pytest.raises(ValueError, match="no sampled token for request 'a'"):
        sched.update(out, {})


class FakeKV:
    """The device KV as the scheduler's chunks write it: block -> the token at each slot."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.slots: dict[int, list[int | None]] = {}

    def run(self, out: SchedulerOutput) -> None:
        pool = self.sched.kv.pool
        for chunk in out.chunks:
            r = chunk.request
            tokens = r.all_token_ids
            for pos in range(chunk.start):  # everything attention reads must be what was written
                assert self.slots[r.block_ids[pos // BS]][pos % BS] == tokens[pos], f"{r.request_id} stale KV"
            for pos in range(chunk.start, chunk.start + chunk.num_tokens):
                block = r.block_ids[pos // BS]
                assert pool.ref_count(block) == 1, "a step writes into a shared block"
                self.slots.setdefault(block, [None] * BS)[pos % BS] = tokens[pos]


def checked_step(sched: Scheduler, kv: FakeKV, outgrown: set[str]) -> SchedulerOutput:
    out = sched.schedule()
    assert out.num_tokens == sum(c.num_tokens for c in out.chunks) <= sched.config.max_num_batched_tokens
    assert len({c.request.request_id for c in out.chunks}) == len(out.chunks)
    outgrown.update(r.request_id for r in out.finished)
    kv.run(out)
    sampled = {c.request.request_id: next_token(c.request.all_token_ids) for c in out.chunks if c.samples}
    sched.update(out, sampled)
    for chunk in out.chunks:
        r = chunk.request
        if chunk.samples and r.num_output_tokens >= r.sampling_params.max_tokens:
            sched.finish(r, RequestStatus.FINISHED_LENGTH)
    sched.check_integrity()
    return out


@pytest.mark.parametrize("seed", range(8))
def test_random_workloads_keep_integrity_and_outputs(seed: int) -> None:
    rng = random.Random(seed)
    caching = seed % 3 != 0
    sched = make(
        num_blocks=rng.randint(12, 40), max_seqs=rng.randint(1, 6), budget=rng.randint(8, 40), caching=caching
    )
    kv = FakeKV(sched)
    shared_prefix = list(range(500, 512))
    requests: list[Request] = []
    aborted: set[str] = set()
    outgrown: set[str] = set()
    for i in range(60):
        if rng.random() < 0.5:
            n = rng.randint(1, 30)
            prompt = (shared_prefix[: rng.randint(0, 12)] + [rng.randint(0, 99) for _ in range(n)])[:40]
            params = SamplingParams(max_tokens=rng.randint(1, 12))
            requests.append(Request(f"r{i}", prompt, params, session_id=rng.choice("xyz")))
            sched.add(requests[-1])
        if requests and rng.random() < 0.05:
            victim = rng.choice(requests)
            if sched.abort(victim.request_id):
                aborted.add(victim.request_id)
                sched.check_integrity()
        checked_step(sched, kv, outgrown)
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        out = checked_step(sched, kv, outgrown)
        assert out.chunks or out.finished, "requests remain but nothing was scheduled"
    assert not sched.has_unfinished() and sched.kv.num_used_blocks == 0
    capacity_tokens = sched.kv.capacity * BS
    for r in requests:
        expected = expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)
        if r.request_id in outgrown:  # stopped by the scheduler: it could not fit the cache any more
            assert r.num_tokens > capacity_tokens and r.output_token_ids == expected[: r.num_output_tokens]
        elif r.request_id not in aborted:
            assert r.status == RequestStatus.FINISHED_LENGTH and r.output_token_ids == expected
