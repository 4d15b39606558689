"""LLMEngine and AsyncEngine behaviour on the embedded model: limits, stops, aborts, errors."""

from __future__ import annotations

import asyncio

import pytest
from engine_thread import Settled, settle  # sibling module: pytest puts tests/engine on sys.path

from app.engine.core.async_engine import AsyncEngine
from app.engine.interface import ContextOverflowError, GenerationRequest
from app.engine.sampling_params import SamplingParams

PROMPT = "Once upon a time, in a village by the sea, there lived"


def greedy(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, **kwargs)


def test_max_tokens_is_exact_and_reported_as_length(embedded_engine):
    ids = embedded_engine.tokenizer.encode(PROMPT)
    result = embedded_engine.generate([ids], greedy(max_tokens=7, ignore_eos=True))[0]
    assert len(result["token_ids"]) == 7
    assert result["finish_reason"] == "length"
    assert result["text"] == embedded_engine.tokenizer.decode(result["token_ids"])


def test_stop_string_cuts_the_text_and_is_not_shown(embedded_engine):
    ids = embedded_engine.tokenizer.encode(PROMPT)
    free = embedded_engine.generate([ids], greedy(max_tokens=24, ignore_eos=True))[0]["text"]
    words = free.split()
    assert len(words) > 3
    stop = words[2]
    cut = embedded_engine.generate([ids], greedy(max_tokens=24, ignore_eos=True, stop=[stop]))[0]
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == free[: free.index(stop)]
    kept = embedded_engine.generate(
        [ids], greedy(max_tokens=24, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    )[0]
    assert kept["text"] == free[: free.index(stop) + len(stop)]


@pytest.mark.slow  # 41 s measured with make test-fast on this machine (3 s in a quiet full run)
def test_seeded_sampling_repeats(embedded_engine):
    ids = embedded_engine.tokenizer.encode(PROMPT)
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=1234, max_tokens=10, ignore_eos=True)
    first = embedded_engine.generate([ids], params)[0]["token_ids"]
    again = embedded_engine.generate([ids], params)[0]["token_ids"]
    other = embedded_engine.generate(
        [ids], SamplingParams(temperature=0.9, top_p=0.9, seed=99, max_tokens=10, ignore_eos=True)
    )[0]["token_ids"]
    assert first == again
    assert first != other


def test_context_overflow_names_both_numbers(embedded_engine):
    limit = embedded_engine.max_model_len
    ids = [2] + [107] * (limit - 10)
    with pytest.raises(ContextOverflowError) as info:
        embedded_engine.add_request("too-long", ids, greedy(max_tokens=50))
    message = str(info.value)
    assert str(limit) in message and str(len(ids)) in message and "50" in message
    assert not embedded_engine.has_unfinished()


def test_bad_prompts_are_rejected_before_any_work(embedded_engine):
    with pytest.raises(ValueError, match="empty"):
        embedded_engine.add_request("empty", [], greedy())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        embedded_engine.add_request("bad-id", [2, 10**9], greedy())


def test_async_engine_streams_and_a_closed_stream_frees_its_blocks(embedded_engine):
    async def scenario() -> tuple[str, int]:
        engine = AsyncEngine(engine=embedded_engine)
        try:
            ids = engine.tokenizer.encode(PROMPT)
            pieces = []
            async for out in engine.generate(GenerationRequest(ids, greedy(max_tokens=6, ignore_eos=True))):
                pieces.append(out.new_text)
            # A stream abandoned after two deltas must abort its request and release its KV.
            stream = engine.generate(GenerationRequest(ids, greedy(max_tokens=200, ignore_eos=True)))
            seen = 0
            async for _ in stream:
                seen += 1
                if seen == 2:
                    break
            await stream.aclose()  # sends the abort
            return "".join(pieces), await settle(engine)
        finally:
            await engine.shutdown()

    text, settled = asyncio.run(scenario())
    assert text
    # synchronous decode: the abort is applied before the next command, so one round trip sees it
    assert settled == Settled(rounds=1, unfinished=False, requests_running=0, kv_blocks_used=0)
    assert embedded_engine.kv.num_used_blocks == 0


def test_async_engine_reports_overflow_before_streaming(embedded_engine):
    async def scenario() -> None:
        engine = AsyncEngine(engine=embedded_engine)
        try:
            ids = [2] * (embedded_engine.max_model_len + 1)
            with pytest.raises(ContextOverflowError):
                async for _ in engine.generate(GenerationRequest(ids, greedy(max_tokens=1))):
                    pass
        finally:
            await engine.shutdown()

    asyncio.run(scenario())
