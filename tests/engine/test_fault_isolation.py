"""One bad request never hurts another: a request whose sampling or postprocessing fails ends alone,
with its own error and its blocks freed, while every other request in the batch goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.engine.config import EngineConfig
from app.engine.core.async_engine import AsyncEngine
from app.engine.core.engine import LLMEngine
from app.engine.core.output_processor import OutputProcessor
from app.engine.interface import EngineDeadError, GenerationRequest, RequestFailedError
from app.engine.request import Request
from app.engine.sample import sampler as sampler_module
from app.engine.sampling_params import SamplingParams

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "qwen3" / "qwen3-kquants.gguf"
PROMPTS = {"a": [1, 2, 3, 4, 5], "b": [7, 8, 9], "c": [11, 12] * 6}
POISON = "poison"


def greedy(**kwargs: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, **{"ignore_eos": True, **kwargs})


def poison_sampling_after(monkeypatch: pytest.MonkeyPatch, tokens: int) -> None:
    """The poison request's penalty step raises once it has `tokens` output tokens; other rows are untouched."""
    real = sampler_module.apply_penalties

    def apply_penalties(row: Any, request: Request) -> None:
        if request.request_id == POISON and request.num_output_tokens >= tokens:
            raise IndexError("index -1000000000000 is out of bounds for axis 1 with size 262144")
        real(row, request)

    monkeypatch.setattr(sampler_module, "apply_penalties", apply_penalties)


def small_engine(async_decode: bool = False) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=str(MODEL), device="cpu", max_model_len=128, max_num_seqs=4, block_size=4,
                     max_num_batched_tokens=16, async_decode=async_decode)
    )  # fmt: skip


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, dict]:
    results: dict[str, dict] = {
        rid: {"token_ids": [], "finish_reason": None, "error": None} for rid in requests
    }
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    while engine.has_unfinished():
        for out in engine.step():
            res = results[out.request_id]
            res["token_ids"] += out.new_token_ids
            if out.finished:
                res["finish_reason"], res["error"] = out.finish_reason, out.error
        engine.scheduler.check_integrity()
    assert engine.kv.num_used_blocks == 0, "KV blocks leaked"
    return results


def test_poison_pill_streams_beside_three_others_that_finish_unchanged(embedded_engine, monkeypatch):
    """Acceptance (issue 24): 3 streaming requests run while a fourth fails inside sampling; the 3
    complete with the same tokens as without the fourth (greedy, embedded model, AsyncEngine)."""
    prompts = ["Once upon a time", "The capital of France is", "def fibonacci(n):"]

    async def stream(engine: AsyncEngine, request: GenerationRequest) -> list[int] | Exception:
        tokens: list[int] = []
        try:
            async for out in engine.generate(request):
                tokens += out.new_token_ids
        except Exception as exc:
            return exc
        return tokens

    async def scenario(with_poison: bool) -> list[list[int] | Exception]:
        engine = AsyncEngine(engine=embedded_engine)
        try:
            requests = [
                GenerationRequest(engine.tokenizer.encode(p), greedy(max_tokens=12), request_id=f"r{i}")
                for i, p in enumerate(prompts)
            ]
            if with_poison:
                ids = engine.tokenizer.encode("A poisoned request")
                params = greedy(max_tokens=12, repetition_penalty=1.1)
                requests.append(GenerationRequest(ids, params, request_id=POISON))
            return await asyncio.gather(*(stream(engine, r) for r in requests))
        finally:
            await engine.shutdown()

    alone = asyncio.run(scenario(with_poison=False))
    poison_sampling_after(monkeypatch, tokens=3)
    *beside, poisoned = asyncio.run(scenario(with_poison=True))

    assert beside == alone
    assert all(len(tokens) == 12 for tokens in alone)
    assert isinstance(poisoned, RequestFailedError)
    assert "sampling" in str(poisoned) and "out of bounds" in str(poisoned)
    assert embedded_engine.kv.num_used_blocks == 0
    assert embedded_engine.stats().requests_running == 0


@pytest.mark.parametrize("async_decode", [False, True])
def test_a_row_that_fails_sampling_ends_alone_with_its_blocks_freed(monkeypatch, async_decode):
    requests = {rid: (prompt, greedy(max_tokens=10)) for rid, prompt in PROMPTS.items()}
    alone = run(small_engine(async_decode), requests)
    poison_sampling_after(monkeypatch, tokens=4)
    requests[POISON] = ([20, 21, 22], greedy(max_tokens=10, repetition_penalty=1.2))
    with_poison = run(small_engine(async_decode), requests)

    assert {rid: with_poison[rid] for rid in PROMPTS} == alone
    assert with_poison[POISON]["finish_reason"] == "error"
    assert with_poison[POISON]["token_ids"] == with_poison[POISON]["token_ids"][:4]
    assert "IndexError" in with_poison[POISON]["error"]


def test_a_batched_launch_that_fails_is_sampled_row_by_row(monkeypatch):
    """Async decode launches steps ahead; a launch that raises for one row falls back to a
    synchronous step in which only that row's request ends."""
    requests = {rid: (prompt, greedy(max_tokens=10)) for rid, prompt in PROMPTS.items()}
    expected = run(small_engine(async_decode=False), requests)
    engine = small_engine(async_decode=True)
    real_launch, real_sample = engine.sampler.launch, engine.sampler.sample
    poisoned = {"launch": 0}

    def launch(logits: Any, rows: list[Request]) -> Any:
        if any(r.request_id == "b" and r.num_output_tokens >= 5 for r in rows):
            poisoned["launch"] += 1
            raise OverflowError("Python integer -1 out of bounds for uint64")
        return real_launch(logits, rows)

    def sample(logits: Any, rows: list[Request]) -> Any:
        if any(r.request_id == "b" and r.num_output_tokens >= 5 for r in rows):
            raise OverflowError("Python integer -1 out of bounds for uint64")
        return real_sample(logits, rows)

    monkeypatch.setattr(engine.sampler, "launch", launch)
    monkeypatch.setattr(engine.sampler, "sample", sample)
    results = run(engine, requests)

    assert poisoned["launch"] >= 1
    assert results["a"] == expected["a"] and results["c"] == expected["c"]
    assert results["b"]["finish_reason"] == "error"
    assert results["b"]["token_ids"] == expected["b"]["token_ids"][: len(results["b"]["token_ids"])]


def test_a_request_whose_postprocessing_fails_ends_alone(monkeypatch):
    requests = {rid: (prompt, greedy(max_tokens=8)) for rid, prompt in PROMPTS.items()}
    expected = run(small_engine(), requests)
    real = OutputProcessor.process

    def process(self: OutputProcessor, request: Request, token_id: int, logprob: Any) -> Any:
        if request.request_id == "c" and request.num_output_tokens >= 2:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return real(self, request, token_id, logprob)

    monkeypatch.setattr(OutputProcessor, "process", process)
    results = run(small_engine(), requests)

    assert results["a"] == expected["a"] and results["b"] == expected["b"]
    assert results["c"]["finish_reason"] == "error"
    assert "postprocessing" in results["c"]["error"] and "UnicodeDecodeError" in results["c"]["error"]


def test_a_failed_forward_pass_still_fails_the_whole_batch(monkeypatch):
    engine = small_engine()

    def run_forward(chunks: Any) -> Any:
        raise MemoryError("out of device memory")

    monkeypatch.setattr(engine.runner, "run", run_forward)

    async def scenario() -> list[BaseException | None]:
        client = AsyncEngine(engine=engine)

        async def one(prompt: list[int]) -> BaseException | None:
            try:
                async for _ in client.generate(GenerationRequest(prompt, greedy(max_tokens=4))):
                    pass
            except Exception as exc:
                return exc
            return None

        try:
            return await asyncio.gather(*(one(p) for p in PROMPTS.values()))
        finally:
            await client.shutdown()

    errors = asyncio.run(scenario())
    assert all(isinstance(e, EngineDeadError) and not isinstance(e, RequestFailedError) for e in errors)
    assert engine.kv.num_used_blocks == 0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (greedy(seed=-1), "seed must be between 0 and 2**64 - 1"),
        (greedy(seed=2**64), "seed must be between 0 and 2**64 - 1"),
        (greedy(min_tokens=1, stop_token_ids=[-1_000_000_000_000]), "stop_token_ids: -1000000000000"),
        (greedy(stop_token_ids=[10**9]), "outside the vocabulary"),
    ],
)
def test_sampling_ids_no_sampler_can_use_are_refused_at_add(embedded_engine, params, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        embedded_engine.add_request("bad", [2, 3], params)
    assert not embedded_engine.has_unfinished()
