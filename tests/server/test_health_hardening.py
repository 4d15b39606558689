"""`/health` never waits on the engine or on a request's heavy work (issue 24: it answers within 100 ms
during every hostile case).

Timing on a shared 2-core machine is noise, so the bound is shown in two ways that are not:
- held work: with the engine thread stalled and a large body's parse parked on its worker, every
  `/health` poll is answered while both are still held (a reply that waited on either could not come);
- CPU time: while a 30 MB request is served, the event loop's thread never works for more than a quarter
  of that bound (CPU time) between two turns of a 1 ms sampler, so a /health request arriving at any
  moment waits behind less.
  Thread CPU time does not grow when the machine is loaded, as wall time does.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from app.engine.server import json_body

from .fakes import FakeEngine

CHAT = "/v1/chat/completions"
HEALTH_BOUND_S = 0.1  # issue 24's acceptance line
# The loop's longest stretch of work may take 40 % of the bound: the rest is left to the machine.
# (Parsing the 30 MB body on the loop, as FastAPI does, took 50-80 ms of it on a quiet machine and
# 120-290 ms on a busy one; off the loop the longest stretch is about 1.5 ms, and up to 26 ms on a
# 2-core machine running other test workers and jobs.)
LOOP_SHARE_S = 0.4 * HEALTH_BOUND_S
# The measure is the median attempt's longest stretch. A stretch the machine adds (68 ms once on CI's
# loaded 2-core machine, beside 1-2 ms ones: the kernel's work inside a page fault, say, is charged to
# the faulting thread) comes in one attempt, not in most; the request's own work on the loop comes in
# every one (the parse there: 50-100 ms on a quiet machine, and now and then under 40).
ATTEMPTS = 3
POLLS = 20
HANG = 60  # seconds: bounds a broken run only


def chat(model: str, content: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **fields}


@contextmanager
def engine_stalled(engine: Any) -> Iterator[None]:
    """The engine holds every request: the real engine's thread blocks; the fake holds its prefills."""
    gate = threading.Event()
    if isinstance(engine, FakeEngine):
        engine.prefill_gate = gate
        try:
            yield
        finally:
            gate.set()
            engine.prefill_gate = None
        return
    stalled = engine.call(lambda: gate.wait(HANG))  # runs on the engine thread, which waits there
    try:
        yield
    finally:
        gate.set()
        stalled.result(HANG)


def in_thread(work: Any) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        result["value"] = work()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_health_answers_while_the_engine_and_a_body_parse_are_held(server, engine, model_name, monkeypatch):
    parsing, release = threading.Event(), threading.Event()
    real_parse = json_body.parse_body

    def parked_parse(model: Any, body: bytes) -> Any:
        parsing.set()
        release.wait(HANG)
        return real_parse(model, body)

    monkeypatch.setattr(json_body, "parse_body", parked_parse)
    big = json.dumps(chat(model_name, "hello " * json_body.OFF_LOOP_BYTES))

    def post(**request: Any) -> httpx.Response:
        with httpx.Client(base_url=server.base_url, timeout=HANG) as client:
            return client.post(CHAT, **request)

    with httpx.Client(base_url=server.base_url, timeout=HANG) as client, engine_stalled(engine):
        streaming, streamed = in_thread(lambda: post(json=chat(model_name, "waits", stream=True)))
        parse, parsed = in_thread(lambda: post(content=big, headers={"content-type": "application/json"}))
        assert parsing.wait(HANG), "the large body never reached its worker"
        for _ in range(POLLS):
            assert client.get("/health").status_code == 200
        assert streaming.is_alive() and parse.is_alive(), "the held work finished before the polls"
        release.set()
    parse.join(HANG)
    streaming.join(HANG)
    assert streamed["value"].status_code == 200
    assert parsed["value"].status_code in (200, 400), parsed["value"].text[:300]


LOOP_ROUTE = "/_test/event-loop"


def server_loop(server: Any) -> asyncio.AbstractEventLoop:
    """The server's running event loop, learnt from a route added to its app for the test."""
    state = server.app.state
    if not hasattr(state, "test_loop"):

        async def capture() -> dict[str, str]:
            state.test_loop = asyncio.get_running_loop()
            return {}

        server.app.add_api_route(LOOP_ROUTE, capture)
        assert httpx.get(f"{server.base_url}{LOOP_ROUTE}", timeout=HANG).status_code == 200
    return state.test_loop


@contextmanager
def loop_stretches(server: Any) -> Iterator[list[float]]:
    """CPU seconds the server's event-loop thread spends between turns of a 1 ms sampler task: the
    longest is the most work a just-arrived /health request could wait behind on the loop."""
    stretches: list[float] = []
    stop = threading.Event()

    async def sample() -> None:
        last = time.thread_time()  # the loop thread's own CPU time: descheduling does not count
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.thread_time()
            stretches.append(now - last)
            last = now

    sampler = asyncio.run_coroutine_threadsafe(sample(), server_loop(server))
    # the collector's pauses belong to this test process's heap (every fixture of the session), not to
    # the request: they are kept out of the measure. Put back as found: a Qt test's session in the same
    # worker process may have handed collection to the GUI thread (app/ui/gc_guard.py)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield stretches
    finally:
        if was_enabled:
            gc.enable()
        stop.set()
        sampler.result(HANG)


HUGE = "x " * (15 * 1024 * 1024)  # 30 MB of text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, lambda m: chat(m, HUGE)),
        ("/v1/completions", lambda m: {"model": m, "prompt": HUGE, "max_tokens": 4}),
        ("/v1/messages", lambda m: chat(m, HUGE)),
    ],
    ids=["chat", "completions", "messages"],
)
def test_a_30mb_prompt_never_holds_the_event_loop_for_the_health_bound(
    server, http, model_name, path, body
):
    payload = json.dumps(body(model_name)).encode()
    longest: list[float] = []
    for _ in range(ATTEMPTS):
        with loop_stretches(server) as stretches:
            reply = http.post(path, content=payload, headers={"content-type": "application/json"})
            health = http.get("/health")
        assert reply.status_code == 400 and "refused before tokenizing" in reply.text, reply.text[:300]
        assert health.status_code == 200
        assert stretches, "the sampler never ran on the server's loop"
        longest.append(max(stretches))
    assert statistics.median(longest) < LOOP_SHARE_S, longest
