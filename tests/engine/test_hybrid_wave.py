"""A wave of short prompts on a hybrid model through `LLMEngine` (the numpy backend): the snapshot cuts and
the tails run with the decodes (tests/engine/test_hybrid_prefill_steps.py counts the steps at the scheduler)
change no token, cost at most one step against the same wave without cuts, and leave each prompt a snapshot
at its last block boundary that the same wave sent again resumes from.

Without prefix caching a hybrid model keeps no snapshots, so its prefill is cut like a dense model's: that
engine is the reference for the tokens and the step count. The snapshot interval is set past the prompts'
lengths, as Qwen3.5-27B's (~2,400 tokens) is past a chat turn's: these tiny models' default (a snapshot's
bytes in KV tokens) is a block or two, which cuts every prompt into a step per interval.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from test_hybrid_engine import (  # sibling module: tests/engine is on sys.path
    SCORED,
    assert_no_state_held,
    assert_same_scores,
    family_engine,
    family_gguf,
    gguf_dir,  # noqa: F401 (a fixture)
    make_engine,
    manifest,
    prompt,
    toy_hybrid,  # noqa: F401 (a fixture)
)

from app.engine import SamplingParams
from app.engine.core.engine import LLMEngine

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
_waves = itertools.count()


def wave(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[dict[str, Any]], int]:
    """Every prompt added at once, each its own session; each request's tokens, top log-probs and cached
    tokens, and the steps until the last first token."""
    tag = next(_waves)
    ids = [f"wave{tag}-{i}" for i in range(len(prompts))]
    for rid, tokens in zip(ids, prompts, strict=True):
        engine.add_request(rid, tokens, params, session_id=rid)
    results: dict[str, dict[str, Any]] = {rid: {"token_ids": [], "top": [], "cached": -1} for rid in ids}
    steps = first_tokens_by = 0
    started: set[str] = set()
    while engine.has_unfinished():
        steps += 1
        for out in engine.step():
            result = results[out.request_id]
            result["token_ids"] += out.new_token_ids
            if out.logprobs:
                result["top"] += [[value for _, value in step.top] for step in out.logprobs]
            if out.new_token_ids and out.request_id not in started:
                started.add(out.request_id)
                first_tokens_by = steps
            if out.finished:
                result["cached"] = out.num_cached_tokens
    engine.scheduler.check_integrity()
    return [results[rid] for rid in ids], first_tokens_by


@pytest.mark.usefixtures("toy_hybrid")
def test_toy_wave_tokens_and_steps_match_the_wave_without_cuts() -> None:
    lengths = (35, 19, 51, 67, 40, 23, 83, 58, 37, 99, 21, 45)  # none a whole number of 16-token blocks
    prompts = [prompt(200 + i, n) for i, n in enumerate(lengths)]
    plain = make_engine(max_num_batched_tokens=96, max_num_seqs=12, enable_prefix_caching=False)
    expected, plain_steps = wave(plain, prompts, GREEDY)
    engine = make_engine(max_num_batched_tokens=96, max_num_seqs=12, state_snapshot_interval=256)
    assert engine.kv.state is not None and engine.kv.state.snapshots.num_rows > 0
    got, steps = wave(engine, prompts, GREEDY)
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in expected]
    assert steps <= plain_steps + 1, (steps, plain_steps)
    again, again_steps = wave(engine, prompts, GREEDY)  # resumed from each prompt's last block boundary
    assert [r["cached"] for r in again] == [n // 16 * 16 for n in lengths]
    assert [r["token_ids"] for r in again] == [r["token_ids"] for r in expected]
    assert again_steps == 1  # every tail of under a block in one step
    assert_no_state_held(engine)


def test_qwen35_wave_scores_as_without_cuts_and_again_from_the_snapshots(gguf_dir: Any) -> None:  # noqa: F811
    """Qwen3.5's Gated DeltaNet (the 27B's recurrent layers): a wave of eight prompts cut at their last
    block boundary, tails run with the decodes, scores as the same wave without snapshots (greedy tokens and
    top-5 log-probs), and again when sent once more and resumed from the snapshots."""
    tokens = manifest("qwen35")["tokens"]
    prompts = [
        tokens[i : i + n] for i, n in enumerate((11, 13, 19, 21, 27, 29, 35, 37)) if i + n <= len(tokens)
    ]
    assert len(prompts) == 8
    path = family_gguf("qwen35", gguf_dir)
    expected, plain_steps = wave(family_engine(path, max_num_batched_tokens=64, enable_prefix_caching=False),
                                 prompts, SCORED)  # fmt: skip
    engine = family_engine(path, max_num_batched_tokens=64, state_snapshot_interval=256)
    for attempt in ("cut", "resumed"):
        got, steps = wave(engine, prompts, SCORED)
        for result, reference in zip(got, expected, strict=True):
            assert_same_scores(
                (result["token_ids"], np.array(result["top"]), 0),
                (reference["token_ids"], np.array(reference["top"]), 0),
            )
        if attempt == "cut":
            assert steps <= plain_steps + 1, (steps, plain_steps)
        else:
            assert [r["cached"] for r in got] == [len(p) // 8 * 8 for p in prompts]
    assert_no_state_held(engine)
