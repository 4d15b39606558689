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
_PING = object()


class _Pinger:
    """Puts _PING in the queue once `interval` seconds passed without the reader taking anything. One timer
    a stream, moved on lazily: a frame only notes the time (at 128 streams a timeout armed and cancelled
    around every frame was a tenth of the event loop's work per token)."""

    def __init__(self, queue: asyncio.Queue[object], interval: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue, self._interval = queue, interval
        self.last = self._loop.time()
        self._timer = self._loop.call_at(self.last + interval, self._due)

    def _due(self) -> None:
        due = self.last + self._interval
        if self._loop.time() >= due:
            if self._queue.empty():  # anything queued goes out first, and resets the clock
                self._queue.put_nowait(_PING)
            due = self._loop.time() + self._interval
        self._timer = self._loop.call_at(due, self._due)

    def cancel(self) -> None:
        self._timer.cancel()


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
    pinger = _Pinger(queue, interval)
    loop = asyncio.get_running_loop()
    ended = False
    try:
        while True:
            item = await queue.get()
            pinger.last = loop.time()
            if item is _PING:
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
        pinger.cancel()
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
