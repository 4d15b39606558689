"""A fake engine whose answer streams in parts the test lets through one at a time, so what the view
shows between two parts can be checked without timing anything."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from server.fakes import FakeEngine

from app.engine import GenerationRequest, RequestOutput


@dataclass
class HeldEngine(FakeEngine):
    parts: list[str] = field(default_factory=list)  # the answer, in the pieces it streams in
    sent: int = 0  # parts streamed so far
    _gate: asyncio.Event | None = None

    @property
    def waiting(self) -> bool:
        """An answer waits for `release`."""
        return self._gate is not None and not self._gate.is_set()

    def release(self) -> None:
        """Let the next part through."""
        assert self._gate is not None, "no answer is waiting"
        self._gate.set()

    def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        return self._held(request)

    async def _held(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        self.requests.append(request)
        for index, part in enumerate(self.parts):
            self._gate = asyncio.Event()
            await self._gate.wait()
            self.sent = index + 1
            last = index == len(self.parts) - 1
            yield RequestOutput(request.request_id, [0] * len(part), part, None, last, "stop" if last else None,
                                None, len(request.prompt_token_ids), sum(len(p) for p in self.parts[: index + 1]))
        self._gate = None
