"""A consumer behind the engine gets the outputs that piled up as one (AsyncEngine.generate), and
RequestOutput.followed_by, the join it uses."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from app.engine.core.async_engine import AsyncEngine
from app.engine.interface import GenerationRequest
from app.engine.request import RequestOutput, TokenLogprob
from app.engine.sampling_params import SamplingParams

WAIT_S = 10.0


def output(request_id: str, token: int, total: int, finished: bool = False, logprobs: bool = True) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        new_token_ids=[token],
        new_text=f"<{token}>",
        logprobs=[TokenLogprob(token, -0.5 * token)] if logprobs else None,
        finished=finished,
        finish_reason="length" if finished else None,
        stop_reason=None,
        num_prompt_tokens=3,
        num_output_tokens=total,
        num_cached_tokens=1,
    )


class SteppedEngine:
    """An engine whose every step (one token for its one request) waits for the test's go-ahead, so
    the test decides how many steps' outputs wait in the stream before the consumer reads."""

    info = tokenizer = chat_template = vision = None
    max_model_len = 4096

    def __init__(self, tokens: int, fail_after: int | None = None) -> None:
        self.tokens, self.fail_after = tokens, fail_after
        self.request_id: str | None = None
        self.made = 0
        self.begun = 0  # steps given their go-ahead
        self.go = threading.Semaphore(0)
        # set while step() waits for a go-ahead: the step before it has returned and its output was handed over
        self.waiting = threading.Event()

    def check_fits(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        pass

    def add_request(self, request_id: str, *args: object, **kwargs: object) -> None:
        self.request_id = request_id

    def has_unfinished(self) -> bool:
        return self.request_id is not None and self.made < self.tokens

    def step(self) -> list[RequestOutput]:
        self.waiting.set()
        self.go.acquire()
        self.waiting.clear()
        self.begun += 1
        if self.fail_after is not None and self.made == self.fail_after:
            raise RuntimeError("the device fell off the bus")
        self.made += 1
        assert self.request_id is not None
        return [output(self.request_id, self.made, self.made, finished=self.made == self.tokens)]

    def abort(self, request_id: str) -> None:
        self.request_id = None

    def persist_prefix_cache(self) -> None:
        pass

    def stop_background_work(self) -> None:
        pass

    async def run_steps(self, n: int) -> None:
        """Let `n` steps run, and return once the last one's output is in the stream's queue."""
        target = self.begun + n
        for _ in range(n):
            self.go.release()
        deadline = time.monotonic() + WAIT_S
        # the engine thread is back in step() (or idle, the request done) once the last output went out
        while not (self.begun == target and (self.waiting.is_set() or not self.has_unfinished())):
            assert time.monotonic() < deadline, f"the engine thread ran {self.begun} of {target} steps"
            await asyncio.sleep(0.001)
        for _ in range(3):  # the hand-off is a call_soon_threadsafe callback: let the loop run it
            await asyncio.sleep(0.01)


def request() -> GenerationRequest:
    return GenerationRequest(prompt_token_ids=[1, 2, 3], sampling_params=SamplingParams(max_tokens=8))


def test_a_consumer_behind_the_engine_gets_the_piled_up_steps_as_one_output():
    engine = SteppedEngine(tokens=8)
    client = AsyncEngine(engine=engine)

    async def consume() -> list[RequestOutput]:
        stream = client.generate(request())
        reading = asyncio.ensure_future(anext(stream))  # the request goes in with the first read
        await engine.run_steps(1)
        got = [await reading]  # read as it came: one step, one output
        await engine.run_steps(4)  # four steps while the consumer is away
        got.append(await anext(stream))
        await engine.run_steps(1)
        got.append(await anext(stream))
        await engine.run_steps(2)  # the last two, the finish among them
        got.append(await anext(stream))
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
        return got

    try:
        got = asyncio.run(consume())
    finally:
        client.close()
    assert [out.new_token_ids for out in got] == [[1], [2, 3, 4, 5], [6], [7, 8]]
    assert [out.new_text for out in got] == ["<1>", "<2><3><4><5>", "<6>", "<7><8>"]
    assert [[lp.token_id for lp in out.logprobs or []] for out in got] == [[1], [2, 3, 4, 5], [6], [7, 8]]
    assert [out.num_output_tokens for out in got] == [1, 5, 6, 8]
    assert [out.finished for out in got] == [False, False, False, True]
    assert got[-1].finish_reason == "length"


def test_an_error_behind_piled_up_outputs_comes_after_them():
    engine = SteppedEngine(tokens=8, fail_after=3)
    client = AsyncEngine(engine=engine)

    async def consume() -> tuple[RequestOutput, RequestOutput, BaseException]:
        stream = client.generate(request())
        reading = asyncio.ensure_future(anext(stream))
        await engine.run_steps(1)
        first = await reading
        await engine.run_steps(3)  # two outputs, then the failing step
        joined = await anext(stream)
        with pytest.raises(Exception) as failure:
            await anext(stream)
        return first, joined, failure.value

    try:
        first, joined, error = asyncio.run(consume())
    finally:
        client.close()
    assert first.new_token_ids == [1]
    assert joined.new_token_ids == [2, 3] and not joined.finished
    assert "fell off the bus" in str(error)


def test_followed_by_joins_tokens_text_and_logprobs_and_keeps_the_later_totals():
    joined = output("r", 1, 1).followed_by(output("r", 2, 2, finished=True))
    assert joined.new_token_ids == [1, 2] and joined.new_text == "<1><2>"
    assert [lp.token_id for lp in joined.logprobs or []] == [1, 2]
    assert joined.finished and joined.finish_reason == "length" and joined.num_output_tokens == 2
    plain = output("r", 1, 1, logprobs=False).followed_by(output("r", 2, 2, logprobs=False))
    assert plain.logprobs is None


def test_followed_by_refuses_another_request_or_an_output_after_the_finish():
    with pytest.raises(ValueError, match="'a' and 'b'"):
        output("a", 1, 1).followed_by(output("b", 2, 2))
    with pytest.raises(ValueError, match="after its finished one"):
        output("a", 1, 1, finished=True).followed_by(output("a", 2, 2))

