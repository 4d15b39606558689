"""Running engine requests for the serving layer: start, stream, gather, and always clean up.

The serving layer checks that prompt + max_tokens fit on token counts before anything
starts. A whole response then waits for `Generation.start()` (the engine's first output),
so a request the engine rejects is an error response; a stream opens at once and starts
its generations inside, since the first output only comes after the prefill. Whatever
ends the iteration early (a client disconnect cancelling the stream task, an error, a
break) closes the engine's iterator and aborts the request, shielded from the
cancellation that caused it, so its KV blocks are freed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from app.engine import ContextOverflowError, EngineClient, GenerationRequest, RequestOutput, TokenLogprob
from app.engine.server.errors import ApiError, bad_request, client_closed, context_overflow

if TYPE_CHECKING:
    from app.engine.server.metrics import ServerMetrics

log = logging.getLogger(__name__)

WaitForDisconnect = Callable[[], Awaitable[None]]
T = TypeVar("T")


@dataclass
class Completed:
    """Everything one generation produced, gathered for a non-streaming response."""

    # the text's pieces, joined when read: `text += piece` on an attribute copied the whole reply every token
    pieces: list[str] = field(default_factory=list, repr=False)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    draft_tokens: int = 0  # speculative decoding: drafted and verified
    accepted_tokens: int = 0  # of those, accepted

    @property
    def text(self) -> str:
        if len(self.pieces) > 1:
            self.pieces[:] = ["".join(self.pieces)]
        return self.pieces[0] if self.pieces else ""

    def add(self, out: RequestOutput) -> None:
        if out.new_text:
            self.pieces.append(out.new_text)
        self.token_ids += out.new_token_ids
        self.logprobs += out.logprobs or []
        self.finish_reason, self.stop_reason = out.finish_reason, out.stop_reason
        self.prompt_tokens, self.output_tokens = out.num_prompt_tokens, out.num_output_tokens
        self.cached_tokens = out.num_cached_tokens
        self.draft_tokens, self.accepted_tokens = out.num_draft_tokens, out.num_accepted_tokens


class Generation:
    def __init__(
        self,
        engine: EngineClient,
        request: GenerationRequest,
        metrics: ServerMetrics | None = None,
        endpoint: str = "",
        prompt_param: str = "messages",
        on_finish: Callable[[list[int]], None] | None = None,
    ) -> None:
        self._engine = engine
        self._on_finish = on_finish  # given the sampled ids of a request that ran to its end
        self._output_ids: list[int] = []
        self._prompt_param = prompt_param  # the request field an overflow error names
        self.request = request
        self._metrics = metrics
        self._endpoint = endpoint
        self._iterator: Any = None
        self._first: RequestOutput | None = None
        self._arrival = time.monotonic()
        self._saw_token = False
        self._finished = False
        self._closed = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    async def start(self) -> None:
        """Submit the request and wait for its first output; engine rejections raise ApiError."""
        try:
            self._iterator = aiter(self._engine.generate(self.request))
            self._first = await anext(self._iterator)
        except ContextOverflowError as exc:
            await self.close()
            raise context_overflow(exc, self._prompt_param) from exc
        except ValueError as exc:
            await self.close()
            raise bad_request(str(exc)) from exc
        except StopAsyncIteration as exc:
            raise ApiError(500, "The engine ended the request without producing any output.") from exc
        except Exception as exc:
            await self.close()
            raise _engine_failure(exc) from exc
        except BaseException:
            await self.close()
            raise

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """The first output and all that follow; an engine-side abort raises ApiError (503)."""
        if self._first is None:
            await self.start()
        try:
            pending: RequestOutput | None = self._first
            while pending is not None:
                self._observe(pending)
                yield pending
                if pending.finished:
                    return
                try:
                    pending = await anext(self._iterator, None)
                except Exception as exc:  # e.g. the engine loop failed: an error value, not a crash
                    raise _engine_failure(exc) from exc
            raise ApiError(500, "The engine's output stream ended before the request finished.")
        finally:
            await self.close()

    def _observe(self, out: RequestOutput) -> None:
        now = time.monotonic()
        if self._on_finish is not None:
            self._output_ids += out.new_token_ids
        if out.new_token_ids and not self._saw_token:
            self._saw_token = True
            if self._metrics:
                self._metrics.time_to_first_token.labels(self._endpoint).observe(now - self._arrival)
        if not out.finished:
            return
        self._finished = True
        if self._metrics:
            self._metrics.prompt_tokens.labels(self._endpoint).inc(out.num_prompt_tokens)
            self._metrics.generation_tokens.labels(self._endpoint).inc(out.num_output_tokens)
            self._metrics.request_latency.labels(self._endpoint).observe(now - self._arrival)
        if out.finish_reason == "abort":
            raise ApiError(503, "The engine aborted this request (it may be shutting down).")
        if self._on_finish is not None and out.finish_reason in ("stop", "length"):
            self._on_finish(self._output_ids)

    async def close(self) -> None:
        """Idempotent: close the engine's iterator and abort the request unless it finished."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            try:
                if self._iterator is not None and hasattr(self._iterator, "aclose"):
                    await self._iterator.aclose()
                if not self._finished:
                    await self._engine.abort(self.request_id)
            except Exception:  # cleanup must not mask what ended the request
                log.exception("cleaning up request %s failed", self.request_id)


def _engine_failure(exc: Exception) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    log.error("engine failed while serving a request: %s", exc)
    return ApiError(500, f"The engine failed while generating: {exc}")


async def start_all(generations: list[Generation]) -> None:
    """Start every generation at once (each waits for its first output); if one is rejected, close
    them all and re-raise its error."""
    tasks = [asyncio.create_task(generation.start()) for generation in generations]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = next((task for task in tasks if task.done() and task.exception() is not None), None)
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]
    except BaseException:
        await cancel_and_close(tasks, generations)
        raise


async def cancel_and_close(tasks: list[asyncio.Task[Any]], generations: list[Generation]) -> None:
    """Cancel the tasks driving generations, wait for them, and close every generation (aborting it),
    shielded from the cancellation that may have caused this."""
    for task in tasks:
        task.cancel()
    with anyio.CancelScope(shield=True):
        await asyncio.gather(*tasks, return_exceptions=True)
        for generation in generations:
            await generation.close()


async def start_and_collect(
    generations: list[Generation], stream: bool, wait_for_disconnect: WaitForDisconnect | None
) -> list[Completed] | None:
    """Run every generation to the end, or return None at once for a stream (it starts them itself,
    so its first bytes go out before the prefill). A client that hangs up meanwhile aborts them all.
    Raises ApiError: a rejected request, an engine failure, or the client gone (499)."""
    if stream:
        return None
    await until_disconnect(start_all(generations), generations, wait_for_disconnect)
    return await until_disconnect(collect(generations), generations, wait_for_disconnect)


async def merged(generations: list[Generation]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of several generations as they arrive, tagged with each one's index."""
    if len(generations) == 1:
        async with aclosing(generations[0].outputs()) as stream:
            async for out in stream:
                yield 0, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | None, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, generation: Generation) -> None:
        try:
            async with aclosing(generation.outputs()) as stream:
                async for out in stream:
                    await queue.put((index, out, None))
            await queue.put((index, None, None))
        except Exception as exc:
            await queue.put((index, None, exc))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(generations)]
    try:
        running = len(tasks)
        while running:
            index, out, error = await queue.get()
            if error is not None:
                raise error
            if out is None:
                running -= 1
            else:
                yield index, out
    finally:
        await cancel_and_close(tasks, generations)


async def collect(generations: list[Generation]) -> list[Completed]:
    """Run generations to the end."""
    results = [Completed() for _ in generations]
    async with aclosing(merged(generations)) as stream:
        async for index, out in stream:
            results[index].add(out)
    return results


async def until_disconnect(
    work: Coroutine[Any, Any, T], generations: list[Generation], wait_for_disconnect: WaitForDisconnect | None
) -> T:
    """`work`'s result; if the client disconnects first, abort every generation and raise the 499
    ApiError (client_closed)."""
    if wait_for_disconnect is None:
        return await work
    task = asyncio.create_task(work)
    watcher = asyncio.create_task(wait_for_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(task, return_exceptions=True)
                for generation in generations:
                    await generation.close()
    if task.cancelled():
        raise client_closed()
    return task.result()  # re-raises what ended it


def disconnect_waiter(receive: Callable[[], Awaitable[dict[str, Any]]]) -> WaitForDisconnect:
    """Wait on the ASGI channel (the body is already read) until the client hangs up."""

    async def wait() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    return wait


def predictions(completed: list[Completed]) -> dict[str, int]:
    """Speculative decoding's usage fields (OpenAI's predicted-output names): drafted tokens accepted
    and rejected, summed over the choices; none when nothing was drafted."""
    drafted = sum(result.draft_tokens for result in completed)
    if not drafted:
        return {}
    accepted = sum(result.accepted_tokens for result in completed)
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": drafted - accepted}
