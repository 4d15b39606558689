"""Async decode (core/pipeline.py) on the numpy backend: the same tokens, text and finish
reasons as the synchronous engine in every scenario, with step N+1 really launched before step
N's ids are read, and never a placeholder where the host reads token ids."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from engine_thread import settle  # sibling module: pytest puts tests/engine on sys.path

from app.engine.config import EngineConfig
from app.engine.core.async_engine import AsyncEngine
from app.engine.core.engine import LLMEngine
from app.engine.core.scheduler import PrefillLimit, Scheduler, SchedulerOutput
from app.engine.interface import GenerationRequest
from app.engine.plan.engine_plan import async_decode_enabled
from app.engine.request import PLACEHOLDER, Request
from app.engine.sampling_params import SamplingParams
from app.engine.worker import runner as runner_module
from app.engine.worker.runner import token_slice

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "qwen3" / "qwen3-kquants.gguf"
EOS = 2  # the fixture's end-of-sequence id
PROMPTS = {"a": [1, 2, 3, 4, 5], "b": [7, 8, 9], "c": [11, 12] * 6, "d": [40]}

Requests = dict[str, tuple[list[int], SamplingParams]]
Add = Callable[[str, list[int], SamplingParams], None]
Trigger = tuple[str, int, Callable[[LLMEngine, Add], None]]  # when request rid has shown n tokens: act


def make_engine(async_decode: bool, **overrides: Any) -> LLMEngine:
    # Blocks of 4 tokens (many block edges) and 16 tokens a step (prompts go in chunks).
    config = dict(model=str(MODEL), device="cpu", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=16,
                  block_size=4, async_decode=async_decode)  # fmt: skip
    return LLMEngine(EngineConfig(**{**config, **overrides}))


def greedy(**kwargs: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, **{"ignore_eos": True, **kwargs})


def drive(engine: LLMEngine, requests: Requests, triggers: list[Trigger] = (),
          sessions: dict[str, str] | None = None) -> dict[str, dict]:  # fmt: skip
    """Run to completion, checking the scheduler's and the KV cache's integrity after every step;
    each trigger acts once, between steps, when its request has shown n output tokens."""
    results: dict[str, dict] = {}

    def add(rid: str, prompt: list[int], params: SamplingParams) -> None:
        results[rid] = {"token_ids": [], "text": "", "finish_reason": None, "stop_reason": None,
                        "num_output_tokens": 0, "logprobs": []}  # fmt: skip
        engine.add_request(rid, prompt, params, session_id=(sessions or {}).get(rid, "default"))

    for rid, (prompt, params) in requests.items():
        add(rid, prompt, params)
    pending = list(triggers)
    for _ in range(5000):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            res = results[out.request_id]
            res["token_ids"] += out.new_token_ids
            res["text"] += out.new_text
            res["logprobs"] += [(lp.token_id, round(lp.logprob, 5), lp.top) for lp in out.logprobs or []]
            res["num_output_tokens"] = out.num_output_tokens
            if out.finished:
                res["finish_reason"], res["stop_reason"] = out.finish_reason, out.stop_reason
        engine.scheduler.check_integrity()
        for trigger in list(pending):
            rid, count, act = trigger
            if len(results[rid]["token_ids"]) >= count:
                pending.remove(trigger)
                act(engine, add)
    assert not engine.has_unfinished() and engine.pipeline.in_flight is None
    assert not pending, "a trigger never fired"
    engine.scheduler.check_integrity()
    assert engine.kv.num_used_blocks == 0, "KV blocks leaked"
    return results


def both(requests: Requests, triggers: list[Trigger] = (), **config: Any) -> dict[str, dict]:
    """Run the scenario synchronously and with async decode; they must agree in every field, and
    the async run must have launched steps ahead."""
    sync = drive(make_engine(False, **config), requests, triggers)
    engine = make_engine(True, **config)
    run_from_device = engine.runner.run_from_device
    looked_ahead = []
    engine.runner.run_from_device = lambda *args: looked_ahead.append(1) or run_from_device(*args)
    ahead = drive(engine, requests, triggers)
    assert ahead == sync
    assert looked_ahead, "no step was launched ahead"
    return sync


def test_greedy_batch_of_prompts_with_different_lengths_and_limits() -> None:
    requests = {
        rid: (prompt, greedy(max_tokens=n))
        for (rid, prompt), n in zip(PROMPTS.items(), (30, 7, 19, 1), strict=True)
    }
    results = both(requests)
    assert [len(r["token_ids"]) for r in results.values()] == [30, 7, 19, 1]
    assert all(r["finish_reason"] == "length" for r in results.values())


def test_seeded_sampling_with_filters() -> None:
    params = [
        SamplingParams(temperature=0.9, seed=1, max_tokens=25),
        SamplingParams(temperature=1.3, top_k=20, seed=2, max_tokens=25),
        SamplingParams(temperature=0.7, top_p=0.8, seed=3, max_tokens=25),
        SamplingParams(temperature=1.0, min_p=0.1, seed=4, max_tokens=25, ignore_eos=True),
    ]
    both({rid: (prompt, p) for (rid, prompt), p in zip(PROMPTS.items(), params, strict=True)})


def test_eos_stop_and_min_tokens() -> None:
    # With this prompt, seeds 7, 9 and 11 draw EOS after 33, 13 and 4 tokens.
    prompt = [5, 6, 7, 8, 9, 10]
    free = both(
        {
            f"s{seed}": (prompt, SamplingParams(temperature=1.0, seed=seed, max_tokens=60))
            for seed in (7, 9, 11, 12)
        }
    )
    stopped = [r for r in free.values() if r["finish_reason"] == "stop"]
    assert len(stopped) >= 2 and all(r["token_ids"][-1] == EOS for r in stopped)
    held = both({f"s{seed}": (prompt, SamplingParams(temperature=1.0, seed=seed, max_tokens=40, min_tokens=20))
                 for seed in (9, 11)})  # fmt: skip
    assert all(EOS not in r["token_ids"][:20] and len(r["token_ids"]) >= 20 for r in held.values())


def test_stop_strings() -> None:
    text = drive(make_engine(False), {"a": (PROMPTS["a"], greedy(max_tokens=30))})["a"]["text"]
    stop = text[6:8]
    requests = {
        "a": (PROMPTS["a"], greedy(max_tokens=30, stop=[stop])),
        "b": (PROMPTS["a"], greedy(max_tokens=30, stop=[stop], include_stop_str_in_output=True)),
        "c": (PROMPTS["c"], greedy(max_tokens=30, stop=[stop])),
    }
    results = both(requests)
    assert results["a"]["finish_reason"] == "stop" and results["a"]["stop_reason"] == stop
    assert results["a"]["text"] == text[: text.index(stop)]


def test_requests_added_while_others_decode() -> None:
    def adding(rid: str, prompt: list[int], max_tokens: int) -> Callable[[LLMEngine, Add], None]:
        return lambda engine, add: add(rid, prompt, greedy(max_tokens=max_tokens))

    triggers = [
        ("a", 5, adding("late", PROMPTS["c"], 12)),
        ("a", 9, adding("later", [3, 1, 4, 1, 5, 9, 2, 6], 6)),
    ]
    results = both({"a": (PROMPTS["a"], greedy(max_tokens=24))}, triggers)
    assert len(results["late"]["token_ids"]) == 12 and len(results["later"]["token_ids"]) == 6


def test_abort_while_a_step_is_in_flight() -> None:
    seen_in_flight = []

    def abort(engine: LLMEngine, add: Add) -> None:
        seen_in_flight.append(engine.pipeline.in_flight is not None)
        engine.abort("b")

    requests = {rid: (PROMPTS[rid], greedy(max_tokens=20)) for rid in ("a", "b", "c")}
    results = both(requests, [("b", 6, abort)])
    assert results["b"]["finish_reason"] is None and len(results["b"]["token_ids"]) == 6
    assert len(results["a"]["token_ids"]) == len(results["c"]["token_ids"]) == 20
    assert seen_in_flight == [False, True]  # sync first, then async


def test_an_engine_with_everything_aborted_in_flight_drains() -> None:
    engine = make_engine(True)
    for rid in ("a", "b"):
        engine.add_request(rid, PROMPTS[rid], greedy(max_tokens=50))
    for _ in range(3):
        engine.step()
    assert engine.pipeline.in_flight is not None
    engine.abort("a")
    engine.abort("b")
    assert engine.has_unfinished()  # the step in flight still has to be resolved
    assert engine.step() == []
    assert not engine.has_unfinished()
    engine.scheduler.check_integrity()
    assert engine.kv.num_used_blocks == 0


def test_penalties_and_logprobs_fall_back_to_synchronous_steps() -> None:
    requests = {
        "penalised": (PROMPTS["a"], greedy(max_tokens=15, repetition_penalty=1.3, frequency_penalty=0.5)),
        "logprobs": (PROMPTS["b"], greedy(max_tokens=15, logprobs=3)),
        "plain": (PROMPTS["c"], greedy(max_tokens=25)),  # alone at the end: goes in flight then
    }
    results = both(requests)
    assert len(results["logprobs"]["logprobs"]) == 15


def test_kv_pressure_preempts_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    preempted: list[int] = []
    original = Scheduler.schedule

    def counting(self: Scheduler, limit: PrefillLimit | None = None) -> SchedulerOutput:
        out = original(self, limit)
        preempted.append(len(out.preempted))
        return out

    monkeypatch.setattr(Scheduler, "schedule", counting)
    # 11 usable blocks of 4 tokens for four requests that grow to 24..35 tokens each.
    requests = {rid: (PROMPTS[rid] + [9] * 3, greedy(max_tokens=20)) for rid in PROMPTS}
    both(requests, num_kv_blocks=12, enable_prefix_caching=False)
    assert sum(preempted) >= 2, "the scenario must preempt (in both runs)"


def test_a_request_runs_up_to_max_model_len() -> None:
    results = both({"a": ([5] * 10, greedy(max_tokens=None)), "b": (PROMPTS["b"], greedy(max_tokens=None))},
                   max_model_len=32)  # fmt: skip
    assert results["a"]["finish_reason"] == results["b"]["finish_reason"] == "length"
    assert len(results["a"]["token_ids"]) == 22 and len(results["b"]["token_ids"]) == 29


def test_look_ahead_gathers_rows_when_the_order_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sessions' chunked prefills end in one step in the order [b, a]; the next decode step
    runs in admission order [a, b], so it takes its ids through a row gather."""
    engine = make_engine(True)
    gathers = []
    inputs = engine.pipeline.inputs
    monkeypatch.setattr(
        engine.pipeline, "inputs", lambda requests: gathers.append(inputs(requests)) or gathers[-1]
    )
    requests = {"a": ([3] * 36, greedy(max_tokens=8)), "b": ([4] * 20, greedy(max_tokens=8))}
    sessions = {"a": "s1", "b": "s2"}
    ahead = drive(engine, requests, sessions=sessions)
    assert any(rows is not None and rows.tolist() == [1, 0] for _, rows in gathers)
    assert ahead == drive(make_engine(False), requests, sessions=sessions)


def test_step_n_plus_one_is_launched_before_step_n_is_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(True)
    events: list[tuple[str, int]] = []
    host_reads: list[list[int]] = []

    def checked_slice(request: Request, start: int, count: int) -> list[int]:
        host_reads.append(request.all_token_ids[start : start + count])
        return token_slice(request, start, count)

    monkeypatch.setattr(runner_module, "token_slice", checked_slice)
    launch = engine.sampler.launch

    def recording_launch(logits: Any, requests: list[Request]) -> Any:
        step = sum(kind == "launch" for kind, _ in events) + 1
        events.append(("launch", step))
        pending = launch(logits, requests)

        def resolve() -> Any:
            events.append(("resolve", step))
            return pending.resolve()

        return SimpleNamespace(device_ids=pending.device_ids, resolve=resolve)

    monkeypatch.setattr(engine.sampler, "launch", recording_launch)
    run_from_device = engine.runner.run_from_device
    monkeypatch.setattr(engine.runner, "run_from_device",
                        lambda *args: events.append(("device ids", 0)) or run_from_device(*args))  # fmt: skip
    for rid in ("a", "b", "d"):  # 9 prompt tokens: one step prefills them all
        engine.add_request(rid, PROMPTS[rid], greedy(max_tokens=10))
    while engine.has_unfinished():
        engine.step()
    steps = [e for e in events if e[0] != "device ids"]
    # one prefill step for all three, then nine decode steps, each launched before the one
    # before it is resolved; the last step is resolved alone
    expected = [("launch", 1)]
    for n in range(2, 11):
        expected += [("launch", n), ("resolve", n - 1)]
    assert steps == [*expected, ("resolve", 10)]
    assert sum(e[0] == "device ids" for e in events) == 9
    assert host_reads and not any(PLACEHOLDER in ids for ids in host_reads)


def test_the_host_paths_refuse_a_placeholder() -> None:
    request = Request("r", [1, 2, 3], greedy())
    request.output_token_ids = [4, PLACEHOLDER]
    assert token_slice(request, 0, 4) == [1, 2, 3, 4]
    with pytest.raises(AssertionError, match="placeholder"):
        token_slice(request, 3, 2)


def test_async_engine_streams_and_an_abandoned_stream_frees_its_blocks() -> None:
    engine = make_engine(True)

    async def scenario() -> tuple[list[int], int]:
        client = AsyncEngine(engine=engine)
        try:
            tokens: list[int] = []
            async for out in client.generate(GenerationRequest(PROMPTS["a"], greedy(max_tokens=12))):
                tokens += out.new_token_ids
            stream = client.generate(GenerationRequest(PROMPTS["b"], greedy(max_tokens=100)))
            seen = 0
            async for _ in stream:
                seen += 1
                if seen == 3:
                    break
            await stream.aclose()  # sends the abort
            return tokens, await settle(client)
        finally:
            await client.shutdown()

    tokens, settled = asyncio.run(scenario())
    expected = drive(make_engine(False), {"a": (PROMPTS["a"], greedy(max_tokens=12))})["a"]["token_ids"]
    # a step may still be in flight when the abort lands: the engine loop resolves it in the next round
    assert tokens == expected and settled.rounds <= 2
    assert settled[1:] == (False, 0, 0)  # nothing unfinished, nothing running, no KV block held
    assert not engine.has_unfinished() and engine.kv.num_used_blocks == 0


def test_async_decode_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The config decides alone (no environment override): None means on exactly with CUDA graphs."""
    assert async_decode_enabled(None, cuda_graphs=True) and not async_decode_enabled(None, cuda_graphs=False)
    assert async_decode_enabled(True, cuda_graphs=False) and not async_decode_enabled(False, cuda_graphs=True)
    monkeypatch.setenv("PADDOCK_ASYNC_DECODE", "0")  # the retired switch no longer overrides the config
    assert make_engine(True).async_decode
    assert not make_engine(None).async_decode  # numpy: off unless asked for
