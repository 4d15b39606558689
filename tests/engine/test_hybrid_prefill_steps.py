"""How many steps a hybrid model's prefill takes against a dense model's, at the scheduler (integers only).

A hybrid model's prefill chunks are cut at recurrent-state snapshot points (cache/state_cache.py
`chunk_tokens`), and a request runs one chunk a step, so every cut can cost a step. These tests pin the
cuts to what they are for (a snapshot at the prompt's last block boundary, snapshots at most `interval`
apart) and the step count to a dense model's: equal where no cut is needed, one more where the prompt's
last block boundary splits it, with first tokens at most one step behind.
"""

from __future__ import annotations

import pytest
from test_scheduler import step  # sibling module: the fake model, one checked step

from app.engine.cache.manager import KVCacheManager
from app.engine.cache.state_cache import StateCache
from app.engine.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from app.engine.request import Request
from app.engine.sampling_params import SamplingParams

BS = 16


def make(
    hybrid: bool, max_seqs: int = 32, budget: int = 2048, interval: int = 0, snapshots: int = 256
) -> Scheduler:
    state = StateCache(max_seqs, snapshots, BS, interval) if hybrid else None
    kv = KVCacheManager(4096, BS, enable_prefix_caching=True, state=state)
    return Scheduler(SchedulerConfig(max_seqs, budget, 16384, BS, True), kv)


def prompts(count: int, length: int, first: int = 0) -> list[list[int]]:
    return [[(first + i) * 100_000 + j for j in range(length)] for i in range(count)]


def wave(
    sched: Scheduler, texts: list[list[int]], max_tokens: int = 4
) -> tuple[list[int], list[SchedulerOutput]]:
    """Add every prompt at once (each its own session, as `paddock bench`'s workers) and step until
    all have their first token: the first tokens sampled in each step, and the steps."""
    requests = [
        Request(f"r{i}", list(ids), SamplingParams(max_tokens=max_tokens), session_id=f"r{i}")
        for i, ids in enumerate(texts)
    ]
    for request in requests:
        sched.add(request)
    firsts: list[int] = []
    outs: list[SchedulerOutput] = []
    while sum(firsts) < len(requests):
        assert len(outs) < 100, "the wave does not finish its prefill"
        out = step(sched)
        outs.append(out)
        firsts.append(sum(1 for c in out.chunks if c.samples and c.start < c.request.num_prompt_tokens))
    return firsts, outs


def cumulative(counts: list[int]) -> list[int]:
    total, out = 0, []
    for n in counts:
        total += n
        out.append(total)
    return out


@pytest.mark.parametrize(
    ("count", "length", "budget"),
    [
        (32, 147, 2048),  # paddock bench's 128-token prompts in Qwen3.5's chat template, one c=32 wave
        (32, 147, 8192),  # the whole wave fits one step's budget
        (8, 40, 64),  # short prompts, a tight budget
        (5, 19, 32),
    ],
)
def test_a_wave_of_short_prompts_takes_at_most_one_step_more_than_on_a_dense_model(
    count: int, length: int, budget: int
) -> None:
    texts = prompts(count, length)
    dense, _ = wave(make(False, budget=budget), texts)
    sched = make(True, budget=budget)
    hybrid, outs = wave(sched, texts)
    # the cut at the prompt's last block boundary costs one step at most: the tails ride in one step
    assert len(hybrid) <= len(dense) + 1
    # first tokens at most one step behind the dense model's, at every step: the tails a cut left go before
    # the next newcomers (before, a 32 x 147 wave sampled no first token until step 3: 0, 0, 28, 4)
    behind = [0, *cumulative(dense)]
    for k, done in enumerate(cumulative(hybrid)):
        assert done >= behind[min(k, len(behind) - 1)], (hybrid, dense)
    # what the cut is for: every prompt's state at its last block boundary was saved and published
    last = length // BS * BS
    ends = {(c.request.request_id, c.start + c.num_tokens) for out in outs for c in out.chunks}
    assert all((f"r{i}", last) in ends for i in range(count))
    assert sched.kv.state is not None and sched.kv.state.snapshots.num_published >= count


def test_a_32_prompt_wave_samples_half_its_first_tokens_in_the_second_step() -> None:
    """The served wave the scheduler cut into steps of 0, 0, 28 and 4 first tokens (all of them late):
    now 0, 14, 13 and 5, against a dense model's 13, 13 and 6."""
    texts = prompts(32, 147)
    dense, _ = wave(make(False), texts)
    hybrid, outs = wave(make(True), texts)
    assert dense == [13, 13, 6]
    assert hybrid == [0, 14, 13, 5]
    assert [out.num_tokens for out in outs[:2]] == [2048, 2048]  # the budget is used, not left to the cuts


@pytest.mark.parametrize("length", [144, 160, 320])
def test_prompts_of_whole_blocks_take_as_many_steps_as_on_a_dense_model(length: int) -> None:
    texts = prompts(32, length)
    dense, _ = wave(make(False), texts)
    hybrid, _ = wave(make(True), texts)
    assert len(hybrid) == len(dense)


def test_a_long_prompt_alone_takes_as_many_steps_as_on_a_dense_model() -> None:
    """Qwen3.5-27B's interval (~2,400 tokens: a snapshot's bytes in KV) is not a multiple of the budget:
    snapshot points at its multiples cut an 8,000-token prompt into 2,048, 352, 2,048, 352, 2,048, 352 and
    800 (seven steps); spaced from each chunk's start they cut nothing the budget did not."""
    texts = prompts(1, 8000)
    dense, _ = wave(make(False), texts)
    sched = make(True, interval=2400)
    hybrid, outs = wave(sched, texts)
    assert len(dense) == len(hybrid) == 4
    assert [c.num_tokens for out in outs for c in out.chunks] == [2048, 2048, 2048, 1856]
    saves = [pair for out in outs for pair in out.state.saves]
    assert len(saves) == 4  # every chunk ends on a block boundary: 2,048, 4,096, 6,144 and 8,000


@pytest.mark.parametrize(("interval", "budget", "others"), [(48, 128, 0), (64, 100, 0), (48, 256, 3)])
def test_snapshots_stay_at_most_an_interval_apart_and_serve_a_shared_prefix(
    interval: int, budget: int, others: int
) -> None:
    """A prompt prefilled beside others (its chunks cut by a shared budget) or alone: its saved snapshots
    are never more than `interval` apart, so a second prompt sharing any prefix resumes within `interval`
    of where they differ."""
    sched = make(True, max_seqs=8, budget=budget, interval=interval)
    texts = prompts(1 + others, 300)
    _, outs = wave(sched, texts)
    saved = sorted(
        c.start + c.num_tokens
        for out in outs
        for c in out.chunks
        if c.request.request_id == "r0" and (c.start + c.num_tokens) % BS == 0
    )
    assert saved[-1] == 288  # the prompt's last block boundary
    assert all(b - a <= interval for a, b in zip([0, *saved], saved, strict=False)), saved
    while sched.has_unfinished():
        step(sched)
    state = sched.kv.state
    assert state is not None
    for shared in (40, 150, 250):
        follow = Request(f"f{shared}", texts[0][:shared] + [7] * 20, SamplingParams(max_tokens=1))
        sched.add(follow)
        step(sched)
        assert shared // BS * BS - interval < follow.num_cached_tokens <= shared // BS * BS
        assert follow.num_cached_tokens in [0, *saved]
        while sched.has_unfinished():
            step(sched)


def test_a_repeated_wave_resumes_every_prompt_at_its_last_block_boundary() -> None:
    """The prefix cache reports what it did: the same 32 prompts again (paddock bench past its prompt
    pool) restore their snapshots at 144 tokens and need only the tails, all in one step."""
    sched = make(True)
    texts = prompts(32, 147)
    wave(sched, texts, max_tokens=1)
    while sched.has_unfinished():
        step(sched)
    state = sched.kv.state
    assert state is not None
    restored = state.restored_tokens
    again = [Request(f"again{i}", list(ids), SamplingParams(max_tokens=1)) for i, ids in enumerate(texts)]
    for request in again:
        sched.add(request)
    out = step(sched)
    assert [r.num_cached_tokens for r in again] == [144] * 32
    assert len(out.state.restores) == 32 and state.restored_tokens - restored == 32 * 144
    assert sorted(c.num_tokens for c in out.chunks) == [3] * 32 and all(c.samples for c in out.chunks)
