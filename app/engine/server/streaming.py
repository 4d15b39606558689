"""Streams that stay alive: frames pass through a pump task, and a ping goes out whenever none came for a while.

A long prompt's prefill can take minutes on a CPU before the first token; clients with idle
watchdogs (Claude Code re-sends after 300 s of silence) and proxies need bytes meanwhile.
Closing the stream early (the client hung up) closes the frames, which aborts the generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import anyio

from app.engine.server.sse import event_frame

ANTHROPIC_PING = event_frame("ping", {"type": "ping"})
COMMENT_PING = ": ping\n\n"  # an SSE comment: every OpenAI client skips it

_END = object()


async def keep_alive(
    frames: AsyncIterator[str],
    ping: str,
    interval: float,
    on_abandoned: Callable[[], None] | None = None,
) -> AsyncIterator[str]:
    """`frames`, with `ping` after every `interval` seconds without one; `on_abandoned()` runs when the
    stream is closed before its frames ended."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=8)
    pump = asyncio.create_task(_pump(frames, queue))
    ended = False
    try:
        while True:
            try:
                async with asyncio.timeout(interval):
                    item = await queue.get()
            except TimeoutError:
                yield ping
                continue
            if item is _END:
                ended = True
                return
            if isinstance(item, BaseException):
                ended = True
                raise item
            yield item  # type: ignore[misc]
    finally:
        pump.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(pump, return_exceptions=True)
        if not ended and on_abandoned is not None:
            on_abandoned()


async def _pump(frames: AsyncIterator[str], queue: asyncio.Queue[object]) -> None:
    try:
        async with aclosing(frames):  # type: ignore[type-var]
            async for frame in frames:
                await queue.put(frame)
    except Exception as exc:  # handed to the reader, which raises it in the response task
        await queue.put(exc)
        return
    await queue.put(_END)
