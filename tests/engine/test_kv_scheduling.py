"""Fairness and preemption under load: the scheduler alone (integers), then a whole engine (fairness on
the tiny Qwen3 fixture, preemption on the embedded Gemma 3 270M).

Fairness, stated: with one session holding every seat with a flood of 32 long prompts, another
session's short request is admitted in the first step after it arrives and samples its first
token within FIRST_TOKEN_STEPS engine steps, not after the flood. Preemption: a KV pool too small
for its concurrent requests completes every one with the greedy tokens of an unconstrained run.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.engine import EngineConfig, SamplingParams
from app.engine.cache.manager import KVCacheManager
from app.engine.core.engine import LLMEngine
from app.engine.core.scheduler import Scheduler, SchedulerConfig
from app.engine.request import Request, RequestStatus

TINY_MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "qwen3" / "qwen3-kquants.gguf"
FIRST_TOKEN_STEPS = 2  # the step that admits it may give the prompt only part of the budget


def _run_step(scheduler: Scheduler) -> set[str]:
    """Schedule and record one step as if every sampling chunk sampled token 7; the ids that sampled."""
    out = scheduler.schedule()
    sampled = {c.request.request_id: 7 for c in out.chunks if c.samples}
    scheduler.update(out, sampled)
    for chunk in out.chunks:
        request = chunk.request
        if request.request_id in sampled and request.num_output_tokens >= request.sampling_params.max_tokens:
            scheduler.finish(request, RequestStatus.FINISHED_LENGTH)
    scheduler.check_integrity()
    return set(sampled)


def test_a_flood_holding_every_seat_gives_one_up_to_a_new_session() -> None:
    kv = KVCacheManager(32 * 70 + 16, 16)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=512, max_model_len=4096,
                                          block_size=16), kv)  # fmt: skip
    flood = [Request(f"f{i}", [i + 1] * 1000, SamplingParams(max_tokens=64), session_id="flood") for i in range(32)]
    for request in flood:
        scheduler.add(request)
    while scheduler.num_running < 32 or scheduler.num_waiting:
        _run_step(scheduler)
    short = Request("s", [9] * 20, SamplingParams(max_tokens=4), session_id="other")
    scheduler.add(short)
    steps = 1
    while "s" not in _run_step(scheduler):
        steps += 1
    assert steps <= FIRST_TOKEN_STEPS
    assert scheduler.num_preemptions == 1  # exactly one flood request gave up its seat
    assert sum(r.status == RequestStatus.PREEMPTED for r in flood) == 1
    while scheduler.has_unfinished():  # and the flood still completes, the preempted one included
        _run_step(scheduler)
    assert all(r.num_output_tokens == 64 for r in flood)


def test_a_session_alone_keeps_every_seat() -> None:
    kv = KVCacheManager(8 * 8 + 1, 16)
    scheduler = Scheduler(SchedulerConfig(4, 256, 1024, 16), kv)
    for i in range(8):
        scheduler.add(Request(f"a{i}", [i + 1] * 40, SamplingParams(max_tokens=8), session_id="a"))
    while scheduler.has_unfinished():
        _run_step(scheduler)
    assert scheduler.num_preemptions == 0


def prompt(i: int, n: int) -> list[int]:
    return [2] + [1000 + (i * 131 + j * 17) % 20000 for j in range(n - 1)]


def tiny_prompt(i: int, n: int) -> list[int]:
    """The same kind of prompt within the tiny fixture's 256-token vocabulary (past its control ids)."""
    return [2] + [3 + (i * 131 + j * 17) % 250 for j in range(n - 1)]


def test_engine_fairness_short_request_first_token_within_two_steps() -> None:
    # Admission is the scheduler's alone, so a tiny model shows it through the whole engine in half a
    # CPU-second (the embedded model took 13: 400 prompt tokens and the flood's decodes).
    engine = LLMEngine(EngineConfig(model=str(TINY_MODEL), device="cpu", max_model_len=512, max_num_seqs=4,
                                    max_num_batched_tokens=128))  # fmt: skip
    flood = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    for i in range(32):
        engine.add_request(f"flood-{i}", tiny_prompt(i, 100), flood, session_id="flood")
    while engine.scheduler.num_running < engine.config.max_num_seqs:
        engine.step()
    assert engine.scheduler.num_waiting == 32 - engine.config.max_num_seqs  # the flood holds every seat
    engine.add_request("short", tiny_prompt(99, 12), SamplingParams(max_tokens=2, temperature=0.0), session_id="other")
    steps, first = 0, None
    while first is None:
        steps += 1
        first = next((o for o in engine.step() if o.request_id == "short" and o.new_token_ids), None)
    assert steps <= FIRST_TOKEN_STEPS
    for i in range(32):
        engine.abort(f"flood-{i}")
    while engine.has_unfinished():
        engine.step()
    engine.scheduler.check_integrity()


@pytest.mark.slow  # 20 s on an idle 2-core machine, 2 min under load: a reference run, a load, recomputes
def test_embedded_preemption_completes_every_request_with_unconstrained_tokens(embedded_engine, caplog) -> None:
    """6 usable blocks of 16 tokens for 4 requests of 50 tokens (4 blocks each): two are admitted with 3
    blocks each, and the first to need a fourth preempts the other."""
    prompts = [prompt(i, 40) for i in range(4)]
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    reference = [r["token_ids"] for r in embedded_engine.generate(prompts, greedy)]
    small = LLMEngine(EngineConfig(device="cpu", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=64,
                                   num_kv_blocks=7))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="paddock.requests"):
        results = small.generate(prompts, greedy)
    assert small.stats().preemptions_total > 0  # the pool really was too small
    assert [r["token_ids"] for r in results] == reference
    assert all(r["finish_reason"] == "length" and "error" not in r for r in results)
    small.scheduler.check_integrity()
    lines = [r.getMessage() for r in caplog.records if r.name == "paddock.requests"]
    assert len(lines) == 4 and all("prompt 40 tokens" in line and "output 10 tokens" in line for line in lines)
    assert all("TTFT" in line and "tok/s" in line for line in lines)
