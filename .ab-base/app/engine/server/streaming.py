"""Streams that stay alive: a ping goes out whenever no frame came for a while.

A long prompt's prefill can take minutes on a CPU before the first token; clients with idle
watchdogs (Claude Code re-sends after 300 s of silence) and proxies need bytes meanwhile.
Closing the stream early (the client hung up) closes the frames, which aborts the generation.

The response's own task drives the frames and sends each as it comes; the pings come from a timer,
each sent by a short task of its own while the stream waits for its next frame (the stream sends
nothing until that ping has gone out whole, so the two never interleave). Frames once went through a
pump task and a queue so that the reader could wait on them with a timeout: two task wake-ups and a
timeout armed and cancelled for every token, which at 128 streams were much of the event loop's
work per token (bench/results/server-loop-cpu-2026-12-07.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Send

from app.engine.server.sse import SSE_HEADERS, event_frame

ANTHROPIC_PING = event_frame("ping", {"type": "ping"})
COMMENT_PING = ": ping\n\n"  # an SSE comment: every OpenAI client skips it


class _Pinger:
    """Sends `ping` once `interval` seconds passed without a frame or a ping: one timer a stream, moved
    on lazily (a frame only notes the time)."""

    def __init__(self, send: Send, ping: bytes, interval: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._send, self._interval = send, interval
        self._message = {"type": "http.response.body", "body": ping, "more_body": True}
        self._last = self._loop.time()
        self._sending = False  # the stream's own send is under way
        self._ping: asyncio.Task[None] | None = None
        self._timer = self._loop.call_at(self._last + interval, self._due)

    def _due(self) -> None:
        now = self._loop.time()
        idle = not self._sending and (self._ping is None or self._ping.done())
        if idle and now >= self._last + self._interval:
            self._retrieve()
            self._ping = self._loop.create_task(self._send(self._message))
            self._last = now
        due = self._last + self._interval
        self._timer = self._loop.call_at(due if due > now else now + self._interval, self._due)

    async def before_frame(self) -> None:
        """Hold the pings, and let one under way go out whole (its failure, a client gone, is raised here)."""
        self._sending = True
        if self._ping is not None:
            ping, self._ping = self._ping, None
            await ping

    def after_frame(self) -> None:
        self._sending = False
        self._last = self._loop.time()

    async def close(self) -> None:
        self._timer.cancel()
        if self._ping is not None and not self._ping.done():
            self._ping.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(self._ping, return_exceptions=True)
        self._retrieve()

    def _retrieve(self) -> None:
        """A finished ping's error is read (it was a client gone; the stream's next send finds the same)."""
        if self._ping is not None and self._ping.done() and not self._ping.cancelled():
            self._ping.exception()


class KeepAliveStream(StreamingResponse):
    """An SSE response of `frames`, with `ping` after every `interval` seconds without one; `on_abandoned()`
    runs when the stream is closed before its frames ended."""

    def __init__(
        self,
        frames: AsyncIterator[str],
        ping: str,
        interval: float,
        on_abandoned: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(frames, media_type="text/event-stream", headers=SSE_HEADERS)
        self._frames = frames  # body_iterator, typed as the async iterator of str it is
        self._ping, self._interval, self._on_abandoned = ping.encode(), interval, on_abandoned

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        pinger = _Pinger(send, self._ping, self._interval)
        ended = False
        try:
            async with aclosing(self._frames):  # type: ignore[type-var]
                async for frame in self._frames:
                    await pinger.before_frame()
                    message: dict[str, Any] = {"type": "http.response.body", "body": frame.encode(), "more_body": True}
                    await send(message)
                    pinger.after_frame()
            ended = True
        finally:
            await pinger.close()
            if not ended and self._on_abandoned is not None:
                self._on_abandoned()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
