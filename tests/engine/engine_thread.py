"""Waiting on `AsyncEngine`'s engine thread by the order of its commands and steps, never by the clock."""

from __future__ import annotations

import asyncio
import threading
from typing import NamedTuple

from app.engine.core.async_engine import AsyncEngine

HANG_GUARD_S = 300  # only ends a broken run (an engine loop that stopped stepping); never reached otherwise


class Settled(NamedTuple):
    rounds: int  # snapshots taken, one step of the engine loop apart
    unfinished: bool  # whether a request (or a step in flight) was still left at the last one
    requests_running: int
    kv_blocks_used: int


async def settle(client: AsyncEngine, max_rounds: int = 3) -> Settled:
    """The engine's state once every command sent before this call has been handled, and again after
    each further step of the engine loop while something is left unfinished (a step in flight under
    async decode is resolved by the next step), at most `max_rounds` snapshots.

    Commands are drained in the order they were sent and `call` runs between steps, so the first
    snapshot sees every earlier abort applied. Each later one waits for a step counted after the one
    before it: a command sent at once could be drained before the loop steps again. Snapshots are
    read on the engine thread, so nothing races a step.
    """
    engine = client.engine
    step = engine.step
    steps = 0
    stepped = threading.Condition()

    def counted_step():
        nonlocal steps
        try:
            return step()
        finally:
            with stepped:
                steps += 1
                stepped.notify_all()

    def snapshot() -> tuple[int, bool, int, int]:
        return steps, engine.has_unfinished(), engine.stats().requests_running, engine.kv.num_used_blocks

    def wait_for_a_step_after(seen: int) -> None:
        with stepped:
            assert stepped.wait_for(lambda: steps > seen, timeout=HANG_GUARD_S), "the engine loop stopped stepping"

    engine.step = counted_step  # the engine loop looks it up on every iteration
    try:
        for rounds in range(1, max_rounds + 1):
            seen, busy, running, used = await asyncio.wrap_future(client.call(snapshot))
            if not busy or rounds == max_rounds:
                return Settled(rounds, busy, running, used)
            await asyncio.to_thread(wait_for_a_step_after, seen)
    finally:
        del engine.step  # the class's method again
    raise AssertionError("unreachable: max_rounds < 1")
