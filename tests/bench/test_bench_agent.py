"""`paddock bench`'s agent workload against the real server over the embedded model: the requests it
sends (a shared prefix, each turn re-sending the conversation) and the report, cached tokens included."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from app.cli import build_parser
from app.commands import bench
from app.commands.bench_load import TurnResult
from app.engine.core.async_engine import AsyncEngine
from app.engine.server.launch import ServerHandle
from app.engine.server.settings import ServerSettings

# The embedded model on the CPU: ~45 s for the agent run on a busy 2-core machine.
slow = pytest.mark.slow

PREFIX, TURNS, CONCURRENCY, NEW = 64, 2, 2, 12


@pytest.fixture(scope="module")
def agent_run(embedded_engine):
    """One small agent run (prefix 64 tokens, 2 turns, 2 sessions): (summary, results, chat bodies sent)."""
    engine = AsyncEngine(engine=embedded_engine)
    handle = ServerHandle(engine, settings=ServerSettings(port=0))
    handle.start()
    bodies: list[dict] = []

    async def record(request: httpx.Request) -> None:
        if request.url.path == "/v1/chat/completions":
            bodies.append(json.loads(request.content))

    args = build_parser().parse_args([
        "bench", "--url", handle.base_url, "--prefix-tokens", str(PREFIX), "--turns", str(TURNS),
        "--concurrency", str(CONCURRENCY), "--input-tokens", str(NEW), "--output-tokens", "4",
    ])  # fmt: skip

    async def go():
        async with httpx.AsyncClient(
            base_url=handle.base_url, timeout=600, event_hooks={"request": [record]}
        ) as client:
            return await bench.measure(args, client)

    try:
        summary, results = asyncio.run(go())
        with httpx.Client(base_url=handle.base_url) as http:
            tokens = http.post(
                "/tokenize", json={"prompt": bodies[0]["messages"][0]["content"], "add_special_tokens": False}
            )
    finally:
        handle.stop()
        engine.close()
    return summary, results, bodies, tokens.json()["count"]


@slow
def test_every_request_starts_with_the_same_prefix_of_the_asked_length(agent_run) -> None:
    _, _, bodies, prefix_tokens = agent_run
    assert len(bodies) == CONCURRENCY + CONCURRENCY * TURNS  # warm-up turns, then the timed sessions
    prefixes = {json.dumps(body["messages"][0]) for body in bodies}
    assert len(prefixes) == 1 and bodies[0]["messages"][0]["role"] == "system"
    assert abs(prefix_tokens - PREFIX) <= 2


@slow
def test_each_turn_resends_the_previous_turn_and_its_answer(agent_run) -> None:
    _, results, bodies, _ = agent_run
    first_turns = [b["messages"] for b in bodies if len(b["messages"]) == 2]
    second_turns = [b["messages"] for b in bodies if len(b["messages"]) == 4]
    assert len(second_turns) == CONCURRENCY
    answers = {r.answer for r in results if r.turn == 1}
    for messages in second_turns:
        assert messages[:2] in first_turns  # the whole earlier conversation, prefix included
        assert messages[2]["role"] == "assistant" and messages[2]["content"] in answers
        assert messages[2]["content"] and messages[3]["role"] == "user"
    own_texts = [m[1]["content"] for m in first_turns] + [m[3]["content"] for m in second_turns]
    assert len(set(own_texts)) == len(own_texts)  # no request repeats another's own text


@slow
def test_report_has_every_field_and_cached_tokens_from_the_prefix_cache(agent_run) -> None:
    summary, results, _, _ = agent_run
    for key in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "output_throughput_tok_s", "cached_tokens_mean"):
        assert summary[key] > 0, key
    assert (summary["requests"], summary["sessions"], summary["turns"]) == (
        CONCURRENCY * TURNS,
        CONCURRENCY,
        TURNS,
    )
    assert summary["output_tokens_total"] == 4 * CONCURRENCY * TURNS
    assert [row["turn"] for row in summary["per_turn"]] == [1, 2]
    # After the warm-up every request finds at least the prefix's whole blocks cached; turn 2 also turn 1's prompt.
    assert all(r.cached_tokens >= PREFIX // 16 * 16 for r in results)
    first, second = summary["per_turn"]
    assert (
        second["cached_tokens_mean"] >= first["prompt_tokens_mean"] // 16 * 16 > first["cached_tokens_mean"]
    )
    assert second["prompt_tokens_mean"] > first["prompt_tokens_mean"] + NEW


def test_cached_tokens_are_none_when_the_server_does_not_report_them() -> None:
    args = build_parser().parse_args(["bench", "--turns", "2"])
    results = [
        TurnResult(session=0, turn=t, ttft=0.1, itl=0.01, latency=1.0, output_tokens=8, prompt_tokens=9 * t,
                   cached_tokens=None, answer="x")
        for t in (1, 2)
    ]  # fmt: skip
    summary = bench.summarize(args, results, wall=2.0)
    assert summary["cached_tokens_mean"] is None
    assert [row["cached_tokens_mean"] for row in summary["per_turn"]] == [None, None]
    assert summary["output_throughput_tok_s"] == 8.0


def test_each_turn_reports_its_cached_share_of_the_prompt_and_of_what_it_re_sends() -> None:
    args = build_parser().parse_args(["bench", "--turns", "3"])
    # Turn t of a session: 100 t prompt tokens, 10 out; the server reports all but the new 90 (+ template) cached.
    results = [
        TurnResult(session=s, turn=t, ttft=0.1, itl=0.01, latency=1.0, output_tokens=10, prompt_tokens=100 * t,
                   cached_tokens=0 if t == 1 else 100 * (t - 1) + 5, answer="x")
        for s in (0, 1) for t in (1, 2, 3)
    ]  # fmt: skip
    first, second, third = bench.summarize(args, results, wall=1.0)["per_turn"]
    assert (first["cached_share"], first["resent_tokens_mean"], first["cached_share_of_resent"]) == (
        0,
        0,
        None,
    )
    assert second["resent_tokens_mean"] == 110  # turn 1's prompt and its reply
    assert second["cached_share"] == pytest.approx(105 / 200)
    assert second["cached_share_of_resent"] == pytest.approx(105 / 110)
    assert third["cached_share_of_resent"] == pytest.approx(205 / 210)


def test_tail_latencies_are_nearest_rank_and_never_below_the_median() -> None:
    args = build_parser().parse_args(["bench"])
    results = [
        TurnResult(session=i, turn=1, ttft=(i + 1) / 10, itl=0.01 * (i + 1), latency=2.0, output_tokens=4,
                   prompt_tokens=9, cached_tokens=0, answer="x")
        for i in range(10)
    ]  # fmt: skip
    summary = bench.summarize(args, results, wall=1.0)
    assert summary["ttft_p50_ms"] == pytest.approx(550)
    assert (summary["ttft_p90_ms"], summary["ttft_p99_ms"]) == (pytest.approx(900), pytest.approx(1000))
    two = bench.summarize(args, results[:2], wall=1.0)
    assert two["ttft_p90_ms"] == two["ttft_p99_ms"] == pytest.approx(200)  # the slower of two, not the faster
    assert two["ttft_p50_ms"] == pytest.approx(150)
