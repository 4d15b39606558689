"""The recurrent-state cache's bookkeeping (integers only): slots through the scheduler's
lifecycle (admission, finish, abort, preemption), snapshot rows (LRU, bounded), the chunk cuts
at snapshot points, and prefix hits that resume only where a snapshot exists."""

from __future__ import annotations

import random

import pytest
from test_scheduler import next_token, step  # sibling module: the fake model, one checked step

from app.engine.cache.manager import KVCacheManager
from app.engine.cache.state_cache import StateCache
from app.engine.cache.state_slots import NULL_ROW, SnapshotRows, StateSlots
from app.engine.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from app.engine.request import Request, RequestStatus
from app.engine.sampling_params import SamplingParams

BS = 4


def make(
    num_blocks: int = 64,
    max_seqs: int = 4,
    budget: int = 32,
    snapshots: int = 16,
    interval: int = 16,
    caching: bool = True,
    host_rows: int = 0,
) -> Scheduler:
    state = StateCache(max_seqs, snapshots if caching else 0, BS, interval, host_rows=host_rows)
    kv = KVCacheManager(num_blocks, BS, enable_prefix_caching=caching, state=state)
    return Scheduler(SchedulerConfig(max_seqs, budget, 512, BS, caching), kv)


def req(rid: str, prompt: list[int], max_tokens: int = 4) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens))


def drain(sched: Scheduler) -> list[SchedulerOutput]:
    outs = []
    while sched.has_unfinished():
        outs.append(step(sched))
    return outs


def state(sched: Scheduler) -> StateCache:
    assert sched.kv.state is not None
    return sched.kv.state


# --- rows ---


def test_slots_never_hand_out_the_null_row_and_refuse_double_free() -> None:
    slots = StateSlots(3)
    got = [slots.allocate() for _ in range(3)]
    assert sorted(got) == [1, 2, 3] and NULL_ROW not in got
    assert not slots.can_allocate()
    with pytest.raises(ValueError, match="no free state slot: all 3 are held"):
        slots.allocate()
    slots.free(2)
    with pytest.raises(ValueError, match="state slot 2 is not held"):
        slots.free(2)
    slots.check_integrity()


def test_snapshot_rows_evict_least_recently_used_and_never_a_reserved_row() -> None:
    rows = SnapshotRows(first=5, num_rows=3)
    a, b, c = rows.reserve(), rows.reserve(), rows.reserve()
    assert {a, b, c} == {5, 6, 7}
    assert rows.reserve() is None  # all reserved: nothing to evict
    rows.publish(a, "a")
    rows.publish(b, "b")
    assert rows.lookup("a") == a  # "a" is now fresher than "b"
    assert rows.reserve() == b and not rows.contains("b") and rows.evictions == 1
    rows.release(b)
    rows.publish(c, "a")  # a newer snapshot of the same prefix frees the old row
    assert rows.lookup("a") == c
    rows.check_integrity()
    assert rows.num_published == 1


# --- slot lifecycle through the scheduler ---


def test_slots_follow_admission_finish_and_abort() -> None:
    sched = make(max_seqs=2)
    first, second, third = req("a", list(range(6))), req("b", list(range(10, 16))), req("c", list(range(30, 36)))
    for r in (first, second, third):
        sched.add(r)
    step(sched)
    assert {first.state_slot, second.state_slot} == {1, 2} and third.state_slot is None
    sched.abort("c")  # waiting: held nothing
    sched.abort("a")  # running: gives its slot back
    assert first.state_slot is None and state(sched).slots.num_free == 1
    drain(sched)
    assert state(sched).slots.num_free == 2 and second.state_slot is None


def test_preemption_gives_the_slot_back_and_readmission_takes_one() -> None:
    # 9 usable blocks of 4 tokens: two 14-token prompts that grow past 18 tokens cannot both fit
    sched = make(num_blocks=10, max_seqs=2)
    a, b = req("a", list(range(14)), max_tokens=8), req("b", list(range(100, 114)), max_tokens=8)
    sched.add(a)
    sched.add(b)
    preempted = []
    while sched.has_unfinished():
        out = step(sched)
        for r in out.preempted:
            assert r.state_slot is None and r.status == RequestStatus.PREEMPTED
            preempted.append(r.request_id)
    assert preempted, "the workload was meant to preempt"
    assert state(sched).slots.num_free == 2
    assert a.output_token_ids and b.output_token_ids


def test_admission_waits_for_a_slot_even_with_blocks_free() -> None:
    state_cache = StateCache(1, 0, BS)  # fewer slots than seats: the slot count binds
    kv = KVCacheManager(64, BS, enable_prefix_caching=False, state=state_cache)
    sched = Scheduler(SchedulerConfig(4, 32, 512, BS, False), kv)
    sched.add(req("a", list(range(5))))
    sched.add(req("b", list(range(20, 25))))
    out = step(sched)
    assert [c.request.request_id for c in out.chunks] == ["a"]
    drain(sched)
    assert state_cache.slots.num_free == 1


# --- snapshot points and prefix hits ---


def test_prefill_chunks_end_at_snapshot_points_and_publish_there() -> None:
    sched = make(budget=32, interval=16)
    a = req("a", list(range(50)), max_tokens=1)
    sched.add(a)
    outs = drain(sched)
    ends = [c.start + c.num_tokens for out in outs for c in out.chunks]
    assert ends == [16, 32, 48, 50]  # every interval, then the prompt's last block boundary (48)
    saves = [pair for out in outs for pair in out.state.saves]
    assert len(saves) == 3 and all(src == 1 for src, _ in saves)  # slot 1 -> three snapshot rows
    assert state(sched).snapshots.num_published == 3


def test_a_shared_prefix_resumes_at_the_last_snapshot_inside_the_kv_match() -> None:
    sched = make(budget=32, interval=16)
    prompt = list(range(50))
    drain_one(sched, req("a", prompt, max_tokens=1))
    b = req("b", prompt[:40] + [999] * 10, max_tokens=1)
    sched.add(b)
    out = step(sched)
    # the KV match covers 40 tokens (10 blocks); the snapshots inside it are at 16 and 32
    assert b.num_cached_tokens == 32 and out.chunks[0].start == 32
    assert len(out.state.restores) == 1 and out.state.restores[0][1] == b.state_slot
    drain(sched)


def test_no_snapshot_means_no_prefix_hit() -> None:
    sched = make(snapshots=0)
    prompt = list(range(40))
    drain_one(sched, req("a", prompt, max_tokens=1))
    assert sched.kv.num_cached_blocks == 10  # the KV blocks are cached ...
    b = req("b", [*prompt, 7], max_tokens=1)
    sched.add(b)
    out = step(sched)
    assert b.num_cached_tokens == 0 and out.chunks[0].start == 0  # ... but the state cannot resume there
    assert not out.state
    drain(sched)


def test_a_finished_conversation_leaves_a_snapshot_for_its_next_turn() -> None:
    sched = make(budget=32, interval=0)
    a = req("a", list(range(10)), max_tokens=10)
    drain_one(sched, a)
    # computed: 10 prompt + 9 output tokens (the last sampled one has no KV); decode snapshots at 12
    # and 16 overwrite one held row, published when the request ends
    turn = a.all_token_ids + [500 + i for i in range(7)]
    b = req("b", turn, max_tokens=1)
    sched.add(b)
    step(sched)
    assert b.num_cached_tokens == 16
    drain(sched)


def test_a_decode_saves_only_the_block_boundary_it_cannot_pass_another_after() -> None:
    """min_tokens = max_tokens: the request's end is known, so of the decode's block boundaries only the
    last one it computes is copied out (the others would be overwritten in the held row); the next turn
    resumes there as without min_tokens."""
    sched = make(budget=32, interval=0)
    a = Request("a", list(range(10)), SamplingParams(max_tokens=10, min_tokens=10))
    sched.add(a)
    outs = drain(sched)
    decode_saves = [out.state.saves for out in outs if out.chunks[0].start >= 10 and out.state.saves]
    assert len(decode_saves) == 1  # at 16 (prompt 10 + 9 computed outputs: 19), none at 12
    assert [c.start + c.num_tokens for out in outs for c in out.chunks if out.state.saves] == [8, 16]
    b = req("b", a.all_token_ids + [500 + i for i in range(7)], max_tokens=1)
    sched.add(b)
    step(sched)
    assert b.num_cached_tokens == 16
    drain(sched)
    sched.check_integrity()


@pytest.mark.parametrize("stop_at", [14, 22])
def test_an_abort_before_the_kept_save_publishes_nothing_half_saved(stop_at: int) -> None:
    """A request aborted before its last decode save (the ones before it skipped under min_tokens: 29
    computed tokens, saves at 12..24 skipped, the row taken at 24 for the save at 28) publishes nothing,
    whether it held no row yet (14) or the one taken for the last save (22): a prefix hit resumes from its
    prompt's snapshot, never from a row nothing was copied into."""
    sched = make(budget=32, interval=0, snapshots=4)
    a = Request("a", list(range(10)), SamplingParams(max_tokens=20, min_tokens=20))
    sched.add(a)
    while a.num_computed_tokens < stop_at:
        out = step(sched)
        assert not out.state.saves or out.chunks[0].start < 10  # no decode save before 28
    published = state(sched).snapshots.num_published
    sched.abort("a")
    assert state(sched).snapshots.num_published == published
    b = req("b", [*a.all_token_ids[: stop_at - 1], 7], max_tokens=1)
    sched.add(b)
    step(sched)
    assert b.num_cached_tokens == 8  # the prompt's snapshot
    drain(sched)
    sched.check_integrity()


def test_the_last_decode_saves_row_is_taken_a_block_early() -> None:
    """min_tokens = max_tokens: the row for the last decode save (at 28 of 29 computed tokens) is reserved
    at the boundary before it (24), evicting the least recently used published snapshot then, and the save
    at 28 copies into it."""
    sched = make(budget=32, interval=0, snapshots=2)  # room for one held decode row
    drain_one(sched, req("x", list(range(100, 110)), max_tokens=1))  # one row published (at 8) ...
    rows = state(sched).snapshots
    a = Request("a", list(range(10)), SamplingParams(max_tokens=20, min_tokens=20))  # ... a's prompt the other
    sched.add(a)
    evicted_at = None
    while sched.has_unfinished():
        out = step(sched)
        if evicted_at is None and rows.evictions:
            evicted_at = a.num_computed_tokens
            assert not out.state.saves  # taken, nothing copied
    assert evicted_at == 24 and rows.evictions == 1
    assert rows.num_published == 2  # a's prompt at 8 and its decode's snapshot at 28, published at the end
    b = req("b", [*a.all_token_ids[:28], 7], max_tokens=1)
    sched.add(b)
    step(sched)
    assert b.num_cached_tokens == 28
    drain(sched)


def test_snapshot_memory_stays_bounded() -> None:
    sched = make(snapshots=4, interval=8, budget=64)
    for i in range(6):
        drain_one(sched, req(f"r{i}", [1000 * i + t for t in range(60)], max_tokens=2))
    rows = state(sched).snapshots
    assert rows.num_published <= 4 and rows.evictions > 0
    rows.check_integrity()


def test_a_snapshot_evicted_from_the_device_is_loaded_back_from_host_ram() -> None:
    sched = make(budget=32, interval=16, snapshots=2, host_rows=8)
    fake = FakeState()
    prompt = list(range(50))
    a = req("a", prompt, max_tokens=1)
    sched.add(a)
    while sched.has_unfinished():
        out = sched.schedule()
        fake.run(out)
        sched.update(out, {c.request.request_id: 7 for c in out.chunks if c.samples})
        for c in out.chunks:
            if c.samples:
                sched.finish(c.request, RequestStatus.FINISHED_LENGTH)
    # snapshots at 16, 32 and 48; two device rows: the one at 16 went to host RAM
    host = state(sched).host
    assert host is not None and host.num_published == 1 and state(sched).snapshots.num_published == 2
    b = req("b", prompt[:20] + [999] * 6, max_tokens=1)
    sched.add(b)
    out = sched.schedule()
    fake.run(out)
    assert b.num_cached_tokens == 16 and out.state.loads and not out.state.restores
    assert fake.loaded == 1 and state(sched).host_hits == 1
    sched.check_integrity()


def drain_one(sched: Scheduler, request: Request) -> None:
    sched.add(request)
    drain(sched)


# --- random workloads against a model of the state rows ---


class FakeState:
    """The recurrent state rows as the runner moves them: row -> the tokens its state has seen. A
    chunk that continues a sequence must find exactly the tokens before it in its slot."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[int, ...]] = {}
        self.host: dict[int, tuple[int, ...]] = {}
        self.resumed = self.restored = self.loaded = 0

    def run(self, out: SchedulerOutput) -> None:
        for src, dst in out.state.loads:  # before the forward: loads, restores, spills
            self.rows[dst] = self.host[src]
            self.loaded += 1
        for src, dst in out.state.restores:
            self.rows[dst] = self.rows[src]
            self.restored += 1
        for src, dst in out.state.spills:
            self.host[dst] = self.rows[src]
        for chunk in out.chunks:
            r = chunk.request
            tokens = tuple(r.all_token_ids)
            slot = r.state_slot
            assert slot is not None
            if chunk.start > 0:  # has_initial_state: the slot must hold the state after tokens[:start]
                assert self.rows.get(slot) == tokens[: chunk.start], f"{r.request_id}: wrong state at {chunk.start}"
                self.resumed += 1
            self.rows[slot] = tokens[: chunk.start + chunk.num_tokens]
        for src, dst in out.state.saves:  # after it
            self.rows[dst] = self.rows[src]


@pytest.mark.parametrize("seed", range(8))
def test_random_workloads_resume_only_from_the_right_state(seed: int) -> None:
    """Shared prefixes, multi-turn follow-ups, tight KV (preemption), aborts, few snapshot rows:
    every continued chunk finds its own state, no slot or row leaks, outputs are the model's."""
    rng = random.Random(seed)
    max_seqs = rng.randint(1, 5)
    sched = make(num_blocks=rng.randint(14, 40), max_seqs=max_seqs, budget=max(max_seqs, rng.randint(8, 40)),
                 snapshots=rng.randint(0, 12), interval=rng.choice([0, 8, 12]),
                 host_rows=rng.choice([0, 0, 3, 10]))  # fmt: skip
    fake = FakeState()
    shared = list(range(500, 524))
    requests: list[Request] = []
    finished: list[Request] = []
    aborted: set[str] = set()
    for i in range(80):
        if rng.random() < 0.5:
            if finished and rng.random() < 0.3:  # the next turn of an earlier conversation
                prompt = finished[-1].all_token_ids + [rng.randint(0, 99) for _ in range(rng.randint(1, 8))]
            else:
                prompt = shared[: rng.randint(0, 24)] + [rng.randint(0, 99) for _ in range(rng.randint(1, 20))]
            if len(prompt) + 12 <= 512 and sched.kv.blocks_needed(len(prompt) + 12) <= sched.kv.capacity:
                max_tokens = rng.randint(1, 10)  # and min_tokens up to it: decode saves skipped where it is sure to go on
                params = SamplingParams(max_tokens=max_tokens, min_tokens=rng.choice([0, rng.randint(0, max_tokens)]))
                requests.append(Request(f"r{i}", prompt[:44], params))
                sched.add(requests[-1])
        if requests and rng.random() < 0.05:
            victim = rng.choice(requests)
            if sched.abort(victim.request_id):
                aborted.add(victim.request_id)
                sched.check_integrity()
        out = sched.schedule()
        fake.run(out)
        sampled = {c.request.request_id: next_token(c.request.all_token_ids) for c in out.chunks if c.samples}
        sched.update(out, sampled)
        for chunk in out.chunks:
            r = chunk.request
            if chunk.samples and r.num_output_tokens >= r.sampling_params.max_tokens:
                sched.finish(r, RequestStatus.FINISHED_LENGTH)
                finished.append(r)
        sched.check_integrity()
    for _ in range(3000):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        fake.run(out)
        sampled = {c.request.request_id: next_token(c.request.all_token_ids) for c in out.chunks if c.samples}
        sched.update(out, sampled)
        for chunk in out.chunks:
            r = chunk.request
            if chunk.samples and r.num_output_tokens >= r.sampling_params.max_tokens:
                sched.finish(r, RequestStatus.FINISHED_LENGTH)
        sched.check_integrity()
    assert not sched.has_unfinished()
    assert state(sched).slots.num_free == max_seqs
    assert fake.resumed > 0
    # measured: 12-36 restores in seven of the eight seeds, preemptions in four, aborts in seven
    assert fake.restored > 0 or state(sched).snapshots.num_rows < 4
    for r in requests:
        if r.request_id not in aborted and r.status == RequestStatus.FINISHED_LENGTH:
            prompt = r.prompt_token_ids
            expected = list(prompt)
            for _ in range(r.num_output_tokens):
                expected.append(next_token(expected))
            assert r.output_token_ids == expected[len(prompt) :]
