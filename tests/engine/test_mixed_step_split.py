"""`split_mixed_steps` (PADDOCK_SPLIT_MIXED_STEPS): a step of decodes and one prompt chunk runs as the decode graph's
replay and the prefill graph's (worker/runner.py), not one eager pass. Without a GPU the two replays are stood in for
by eager passes over exactly the chunks each graph would get: the routing and the assembly of the step's logit rows
are checked against the eager step over all chunks, on the numpy backend."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_harness import _chunk, _feed, _garbage_kv_caches, _request

from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.options import KernelOptions
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import build_model
from app.engine.worker.runner import ModelRunner

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "qwen3" / "qwen3-kquants.gguf"
BLOCK = 4


class _Graphs:
    """The decode and prefill graphs' stand-ins: the chunks each replay gets, run eagerly."""

    def __init__(self, runner: ModelRunner, max_prefill: int = 64) -> None:
        self.runner, self.max_prefill = runner, max_prefill
        self.decode_steps: list[list[Any]] = []
        self.prefills: list[Any] = []
        self.eager_steps = 0
        runner.graphs = types.SimpleNamespace(bucket_for=lambda n: n if n <= 8 else None)
        runner.prefill_graphs = types.SimpleNamespace(bucket_for=self._prefill_bucket, run=self._prefill,
                                                      buckets=(16, max_prefill))  # fmt: skip
        eager = runner._run_eager
        runner._run_graph = self._decode  # type: ignore[method-assign]

        def counted(chunks: list[Any]) -> Any:
            self.eager_steps += 1
            return eager(chunks)

        runner._run_eager = counted  # type: ignore[method-assign]
        self._eager = eager
        self.pending: dict[tuple[int, int], Any] = {}

    def _prefill_bucket(self, n: int, start: int) -> int | None:
        return n if n <= self.max_prefill else None

    def _decode(self, chunks: list[Any]) -> Any:
        assert all(c.num_tokens == 1 and c.samples for c in chunks)
        self.decode_steps.append(chunks)
        return self._eager(chunks)

    def _prefill(self, token_ids: list[int], start: int, block_ids: list[int]) -> Any:
        chunk = self.pending[(start, len(token_ids))]
        assert list(token_ids) == chunk.request.all_token_ids[start : start + len(token_ids)]
        self.prefills.append(chunk)
        return self._eager([chunk])


@pytest.fixture(scope="module")
def model() -> Any:
    return build_model(open_checkpoint(FIXTURE), CpuBackend(), 128)


def _runner(model: Any, split: bool) -> ModelRunner:
    backend = CpuBackend()
    backend.kernel_options = KernelOptions(split_mixed_steps=split)
    rng = np.random.default_rng(0)
    return ModelRunner(model, backend, _garbage_kv_caches(model, backend, 64, BLOCK, rng), BLOCK)


def _step(model: Any, prompt_at: int, prompt_tokens: int = 9, prompt_len: int = 20) -> list[Any]:
    """Three requests past their prompts (one decode each) and a prompt's first chunk at `prompt_at`."""
    rng = np.random.default_rng(1)
    vocab = model.config.vocab_size
    chunks, block = [], 1
    for i in range(3):
        tokens = [int(t) for t in rng.integers(0, vocab, 12)]
        request = _request(f"d{i}", tokens, 11)
        request.block_ids = list(range(block, block + 4))
        block += 4
        request.num_computed_tokens = 11  # its KV is the cache's garbage: the same for every run
        _feed(request, tokens)  # the token it decodes now
        chunks.append(_chunk(request, 1))
    prompt = _request("p", [int(t) for t in rng.integers(0, vocab, prompt_len)], prompt_len)
    prompt.block_ids = list(range(block, block + 6))
    chunks.insert(prompt_at, _chunk(prompt, prompt_tokens))
    return chunks


@pytest.mark.parametrize("prompt_at", [3, 1, 0])
def test_a_split_step_returns_the_eager_steps_rows(model, prompt_at: int) -> None:
    chunks = _step(model, prompt_at, prompt_tokens=20)  # the whole prompt: it samples
    runner = _runner(model, split=True)
    graphs = _Graphs(runner)
    graphs.pending[(0, 20)] = chunks[prompt_at]
    got = np.asarray(runner.run(chunks))
    assert graphs.eager_steps == 0 and len(graphs.decode_steps) == 1 and graphs.prefills == [chunks[prompt_at]]
    assert runner.split_steps == 1
    assert graphs.decode_steps[0] == [c for i, c in enumerate(chunks) if i != prompt_at]
    want = np.asarray(_runner(model, split=False)._run_eager(chunks))
    assert got.shape == want.shape == (4, model.config.vocab_size)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_a_prompt_chunk_that_does_not_sample_adds_no_row(model) -> None:
    chunks = _step(model, 3, prompt_tokens=9)
    runner = _runner(model, split=True)
    graphs = _Graphs(runner)
    graphs.pending[(0, 9)] = chunks[3]
    got = np.asarray(runner.run(chunks))
    assert graphs.eager_steps == 0 and graphs.prefills == [chunks[3]]
    want = np.asarray(_runner(model, split=False)._run_eager(chunks))
    assert got.shape == want.shape == (3, model.config.vocab_size)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_steps_the_graphs_do_not_hold_stay_eager(model) -> None:
    """Off by default; a chunk past the prefill buckets; two prompt chunks: one eager pass, no replay."""
    for split, max_prefill, two_prompts in ((False, 64, False), (True, 8, False), (True, 64, True)):
        chunks = _step(model, 3)
        if two_prompts:
            other = _request("q", list(range(1, 15)), 14)
            other.block_ids = [40, 41, 42, 43]
            chunks.append(_chunk(other, 5))
        runner = _runner(model, split=split)
        graphs = _Graphs(runner, max_prefill)
        runner.run(chunks)
        assert (graphs.eager_steps, graphs.decode_steps, graphs.prefills) == (1, [], [])
