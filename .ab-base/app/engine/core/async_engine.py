"""`AsyncEngine`: an `EngineClient` over an in-process `LLMEngine` whose loop runs on its own thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from app.engine import envs
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.interface import (
    EngineDeadError,
    EngineStats,
    GenerationRequest,
    ModelInfo,
    RequestFailedError,
)
from app.engine.request import RequestOutput

log = logging.getLogger(__name__)


@dataclass
class _Stream:
    loop: Any
    queue: Any


class AsyncEngine:
    """An `EngineClient` over an in-process `LLMEngine` whose loop runs on its own thread.

    The thread owns the engine (and the device); the asyncio side only passes commands
    in through a queue and receives outputs through per-request asyncio queues.
    """

    def __init__(self, config: Any = None, *, engine: Any = None) -> None:
        self.engine = engine if engine is not None else LLMEngine(config or EngineConfig())
        self.model: ModelInfo = self.engine.info
        self.tokenizer = self.engine.tokenizer
        self.chat_template = self.engine.chat_template
        self.vision = self.engine.vision  # ImagePrompter, or None for a text-only model
        self.audio = getattr(self.engine, "audio", None)  # Gemma4AudioPrompter, or None without audio
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._stopping = False
        self._join_backlog = envs.PADDOCK_JOIN_BACKLOG
        self._thread = threading.Thread(target=self._loop, name="paddock-engine", daemon=True)
        self._thread.start()

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    async def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        self.engine.check_fits(len(request.prompt_token_ids), request.sampling_params)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._send(("add", request, stream))
        finished = False
        held: BaseException | None = None  # an error that came behind outputs joined into one
        try:
            while True:
                item = held if held is not None else await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                # A consumer behind the engine (a busy event loop at high concurrency) takes what
                # has piled up as one output: one frame for several steps' tokens, so the loop's
                # work per token falls as its backlog grows, rather than the backlog growing.
                while self._join_backlog and not item.finished and not stream.queue.empty():
                    later = stream.queue.get_nowait()
                    if isinstance(later, BaseException):
                        held = later
                        break
                    item = item.followed_by(later)
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:  # the caller stopped listening: free the request's KV blocks
                self._send(("abort", request.request_id, None))

    async def abort(self, request_id: str) -> None:
        self._send(("abort", request_id, None))

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn()` on the engine thread between steps (pooling, scoring); its result or error
        comes back through the returned future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._send(("call", fn, future))
        return future

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def shutdown(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        self._stopping = True
        self._wakeup.set()
        self._thread.join(timeout=30)

    # -- engine thread ------------------------------------------------------------------
    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wakeup.set()

    def _loop(self) -> None:
        while not self._stopping:
            self._wakeup.clear()
            self._drain_commands()
            if not self.engine.has_unfinished():
                self._wakeup.wait()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # keep serving: fail the requests in flight, not the process
                log.exception("engine step failed")
                self._fail_all(EngineDeadError(f"the engine failed while generating: {exc}"))
                continue
            self._deliver_step(outputs)
        try:  # stopping: keep the prefix cache on disk for the next start (where there is a disk tier)
            self.engine.persist_prefix_cache()
        except Exception:
            log.exception("could not save the prefix cache to the KV disk tier")
        try:
            self.engine.stop_background_work()
        except Exception:
            log.exception("could not stop the engine's background work")

    def _drain_commands(self) -> None:
        while True:
            try:
                kind, payload, stream = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._add(payload, stream)
            elif kind == "abort":
                self._streams.pop(payload, None)
                self.engine.abort(payload)
            elif kind == "call" and stream.set_running_or_notify_cancel():
                try:
                    stream.set_result(payload())
                except Exception as exc:  # the caller gets the error; the engine keeps serving
                    stream.set_exception(exc)

    def _add(self, request: GenerationRequest, stream: _Stream) -> None:
        self._streams[request.request_id] = stream
        try:
            self.engine.add_request(
                request.request_id,
                request.prompt_token_ids,
                request.sampling_params,
                request.session_id,
                images=request.images,
            )
        except Exception as exc:
            self._deliver(request.request_id, exc)

    def _deliver_step(self, outputs: list[RequestOutput]) -> None:
        """All of a step's outputs in one hand-off per event loop (one wake-up, not one per request)."""
        by_loop: dict[Any, list[tuple[_Stream, str, RequestOutput | Exception]]] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            # a request that failed alone gets its own error; the others their outputs
            item = RequestFailedError(out.error) if out.error is not None else out
            by_loop.setdefault(stream.loop, []).append((stream, out.request_id, item))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the caller's event loop is gone
                for _, request_id, _ in items:
                    self._streams.pop(request_id, None)
                    self.engine.abort(request_id)

    def _deliver(self, request_id: str, item: Any) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        if isinstance(item, BaseException) or item.finished:
            del self._streams[request_id]
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop is gone
            self._streams.pop(request_id, None)
            self.engine.abort(request_id)

    def _fail_all(self, error: Exception) -> None:
        for request_id in list(self._streams):
            self.engine.abort(request_id)
            self._deliver(request_id, error)


def _put_all(items: list[tuple[_Stream, str, RequestOutput | Exception]]) -> None:
    for stream, _, item in items:
        stream.queue.put_nowait(item)
