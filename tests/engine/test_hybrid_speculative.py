"""Speculative decoding on hybrid models (cache/state_cache.py: checkpoints and rollback): drafts
verified in one step leave the recurrent state where decoding the kept tokens alone leaves it.

On the Qwen3.5, Qwen3-Next and Nemotron-H fixtures (GGUFs in llama.cpp's layout, written at test
time): greedy tokens and their top-5 log-probs with n-gram and draft-model drafting equal those of
decoding without drafts, for a batch of requests whose drafts are rejected mid-draft. The recurrent
state's share of the logits is small on random weights, so tokens alone could hide a state left
after a rejected draft; the log-probs cannot (a state one token off moves them by ~1e-2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hybrid_gguf import write_mamba_gguf, write_qwen_gguf  # sibling module: tests/engine is on sys.path
from spec_checks import assert_sampled_tokens_keep_the_distribution  # sibling: tests/engine is on sys.path

from app.engine import EngineConfig, SamplingParams
from app.engine.cache.state_cache import StateCache
from app.engine.core.engine import LLMEngine
from app.engine.request import Request
from app.engine.spec.speculator import Speculator

HYBRID = Path(__file__).resolve().parents[1] / "fixtures" / "hybrid"
FAMILIES = ("qwen35", "qwen3next", "nemotron_h")
SCORED = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=5)
LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hybrid-spec")


def family_gguf(fam: str, folder: Path) -> Path:
    path = folder / f"{fam}.gguf"
    if path.exists():
        return path
    if fam.startswith("nemotron"):
        return write_mamba_gguf(HYBRID / fam / "hf", fam, path)
    return write_qwen_gguf(HYBRID / fam / "hf", fam, path)


def spec_engine(path: Path, **fields: Any) -> LLMEngine:
    settings: dict[str, Any] = dict(model=str(path), device="cpu", cpu_kernels="numpy", max_num_seqs=4,
                                    max_num_batched_tokens=64, block_size=8, kv_cache_bytes=64 << 20,
                                    speculative="ngram", num_draft_tokens=4, speculative_max_batch=8)  # fmt: skip
    return LLMEngine(EngineConfig(**{**settings, **fields}))


def loop_prompts(count: int = 3, n: int = 24) -> list[list[int]]:
    """Random tokens repeated: every n-gram's continuation is in the prompt, so drafts are proposed;
    the random model mostly disagrees with them after a token or two."""
    out = []
    for seed in range(count):
        part = [int(t) for t in np.random.default_rng(seed).integers(3, 150, n // 2)]
        out.append(part + part)
    return out


def scored(engine: LLMEngine, prompts: list[list[int]]) -> list[tuple[list[int], np.ndarray]]:
    results = engine.generate(prompts, SCORED)
    return [(r["token_ids"], np.array([[v for _, v in step.top] for step in r["logprobs"]])) for r in results]


def without_drafts(engine: LLMEngine, prompts: list[list[int]]) -> list[tuple[list[int], np.ndarray]]:
    speculator, engine.speculator = engine.speculator, None
    try:
        return scored(engine, prompts)
    finally:
        engine.speculator = speculator


def record_verifies(speculator: Speculator, pending: list[int] | None = None) -> list[tuple[int, int]]:
    """(drafted, accepted) of every verify step from now on; `pending` gets each one's tokens before its
    drafts (1, or more after a rollback)."""
    steps: list[tuple[int, int]] = []
    verify = speculator.verify

    def recording(request: Request, drafts: Any, sampled: Any) -> list[int]:
        if pending is not None:
            pending.append(request.num_pending_tokens)
        emitted = verify(request, drafts, sampled)
        steps.append((len(drafts), len(emitted) - 1))
        return emitted

    speculator.verify = recording  # type: ignore[method-assign]
    return steps


def assert_same(got: list[tuple[list[int], np.ndarray]], expected: list[tuple[list[int], np.ndarray]]) -> None:
    for (tokens, top), (want_tokens, want_top) in zip(got, expected, strict=True):
        assert tokens == want_tokens
        assert np.abs(top - want_top).max() <= LOGPROB_TOL


def assert_clean(engine: LLMEngine) -> None:
    engine.scheduler.check_integrity()
    state = engine.kv.state
    assert state is not None
    state.check_integrity()
    assert state.slots.num_free == state.slots.num_slots, "a state slot leaked"


@pytest.mark.parametrize("fam", FAMILIES)
def test_ngram_drafts_leave_greedy_tokens_and_logprobs_as_without(fam: str, gguf_dir: Path) -> None:
    engine = spec_engine(family_gguf(fam, gguf_dir))
    assert engine.model_config.is_hybrid and engine.speculator is not None
    prompts = loop_prompts()
    expected = without_drafts(engine, prompts)
    steps = record_verifies(engine.speculator)
    assert_same(scored(engine, prompts), expected)
    assert any(accepted < drafted for drafted, accepted in steps), f"no draft rejected: {steps}"
    assert engine.speculator.accepted > 0
    assert_clean(engine)


class OracleDrafter:
    """Drafts the greedy continuation known from a run without drafts, its draft `wrong_at` changed:
    every verify step of k > wrong_at drafts rejects mid-draft, after `wrong_at` accepted ones."""

    def __init__(self, prompts: list[list[int]], outputs: list[list[int]], wrong_at: int) -> None:
        self.runs = [(p, o) for p, o in zip(prompts, outputs, strict=True)]
        self.wrong_at = wrong_at

    def propose(self, tokens: list[int], k: int) -> list[int]:
        prompt, output = next((p, o) for p, o in self.runs if tokens[: len(p)] == p)
        drafts = list(output[len(tokens) - len(prompt) :][:k])
        if len(drafts) > self.wrong_at:
            drafts[self.wrong_at] = (drafts[self.wrong_at] + 1) % 150
        return drafts


@pytest.mark.parametrize("wrong_at", [1, 2])
@pytest.mark.parametrize("fam", FAMILIES)
def test_drafts_rejected_mid_draft_leave_greedy_tokens_and_logprobs_as_without(
    fam: str, wrong_at: int, gguf_dir: Path
) -> None:
    """A batch of three whose every verify step keeps `wrong_at` drafts and rejects the next; the step
    after one recomputes the kept tokens and verifies new drafts after them."""
    engine = spec_engine(family_gguf(fam, gguf_dir))
    prompts = [p[:20] for p in loop_prompts()]
    expected = without_drafts(engine, prompts)
    assert engine.speculator is not None
    engine.speculator.drafter = OracleDrafter(prompts, [tokens for tokens, _ in expected], wrong_at)
    pending: list[int] = []
    steps = record_verifies(engine.speculator, pending)
    assert_same(scored(engine, prompts), expected)
    mid = [s for s in steps if s[0] > wrong_at]
    assert len(mid) >= 3 and all(accepted == wrong_at for _, accepted in mid), steps
    # after a rollback the kept tokens (the last one, wrong_at drafts, the correction; more after rollbacks
    # in a row) are recomputed and new drafts verified after them
    assert wrong_at + 2 in pending and max(pending) >= wrong_at + 2, pending
    assert_clean(engine)


@pytest.mark.parametrize(("fam", "draft"), [("qwen35", "qwen3next"), ("nemotron_h", "qwen35"),
                                            ("qwen3next", "qwen3next")])  # fmt: skip
def test_draft_model_drafts_leave_greedy_tokens_and_logprobs_as_without(fam: str, draft: str, gguf_dir: Path) -> None:
    """Another hybrid of the same vocabulary as draft model: drafts mostly rejected; the model itself:
    every draft accepted (the state after a whole verify chunk is kept as it is)."""
    engine = spec_engine(family_gguf(fam, gguf_dir), speculative="draft", draft_model=str(family_gguf(draft, gguf_dir)))
    prompts = loop_prompts()
    expected = without_drafts(engine, prompts)
    assert engine.speculator is not None
    steps = record_verifies(engine.speculator)
    assert_same(scored(engine, prompts), expected)
    drafted, accepted = engine.speculator.drafted, engine.speculator.accepted
    if fam == draft:
        assert drafted > 0 and accepted == drafted
    else:
        assert any(accepted < drafted for drafted, accepted in steps), steps
    assert_clean(engine)


def test_preempted_and_aborted_speculative_requests_leave_the_same_tokens(gguf_dir: Path) -> None:
    """Too few KV blocks for the batch: requests are preempted mid-draft (their slots and checkpoints
    given up) and resume with the tokens of an engine without drafts; an abort in between frees all."""
    path = family_gguf("qwen35", gguf_dir)
    prompts = loop_prompts(4, 40)
    expected = without_drafts(spec_engine(path), prompts)
    tight = spec_engine(path, num_kv_blocks=16)
    tight.add_request("gone", prompts[0], SCORED)
    gone = tight.scheduler.get("gone")
    while gone is not None and gone.num_draft_tokens == 0:
        tight.step()
    tight.abort("gone")  # after a verify step: maybe with a rollback pending
    assert_same(scored(tight, prompts), expected)
    assert tight.scheduler.num_preemptions > 0 and tight.speculator is not None and tight.speculator.drafted > 0
    assert_clean(tight)


def test_rollback_restores_the_slot_from_its_checkpoint_and_drops_a_save_past_the_kept_tokens() -> None:
    state = StateCache(num_slots=2, num_snapshots=4, block_size=4, checkpoints=True)
    assert state.num_rows == 1 + 2 + 4 + 2
    request = Request("r", list(range(11)), SCORED)
    request.num_computed_tokens = 11  # a decode of token 11 and drafts at 12..: ends at 16 with 4 drafts
    request.output_token_ids.append(1)
    slot = state.slot(request)
    state.plan_save(request, 11, 5, samples=True)
    state.plan_verify(request)
    copies = state.take_copies()
    assert copies.checkpoints == [(slot, state.checkpoint_row(slot))] and len(copies.saves) == 1
    state.rollback(request)  # two drafts kept: the state past 11 is recomputed
    assert state.take_copies().restores == [(state.checkpoint_row(slot), slot)]
    request.num_computed_tokens = 18  # later steps passed 16 without a save there (a verify chunk spanning it)
    state.release(request)
    assert state.snapshots.num_published == 0  # the save at 16 held rejected drafts' state: never published
    state.check_integrity()
    with pytest.raises(ValueError, match="keeps no checkpoints"):
        StateCache(num_slots=1, num_snapshots=0, block_size=4).checkpoint_row(1)


def test_the_memory_plan_counts_the_checkpoint_rows_the_engine_allocates(gguf_dir: Path) -> None:
    path = family_gguf("nemotron_h", gguf_dir)
    on, off = spec_engine(path), spec_engine(path, speculative="off")
    per_sequence, slots = on.model_config.state_bytes_per_sequence, on.plan.state_slots
    assert on.plan.state_bytes - off.plan.state_bytes == slots * per_sequence > 0
    allocated = sum(a.nbytes for a in on.runner.state_arrays)
    assert allocated == on.plan.state_bytes == on.kv.state.num_rows * per_sequence
    assert off.kv.state is not None and off.kv.state.num_rows == on.kv.state.num_rows - slots


def test_sampled_tokens_keep_the_targets_distribution(gguf_dir: Path) -> None:
    """The llama test's chi-square (spec_checks.py) on Qwen3.5: both drafts verified at the first decode
    keep the model's distribution, and the later decodes' rejections roll the state back under sampling."""
    engine = spec_engine(family_gguf("qwen35", gguf_dir), max_num_seqs=64, max_num_batched_tokens=512)
    assert_sampled_tokens_keep_the_distribution(engine, loop_prompts(8, 12)[7])
    assert_clean(engine)


@pytest.mark.parametrize("fam", ["qwen35", "nemotron_h"])
def test_prefix_cache_snapshots_never_hold_a_rejected_draft(fam: str, gguf_dir: Path) -> None:
    """A request whose drafts were rejected mid-draft leaves state snapshots of its real tokens only: its
    whole sequence sent again resumes from one (most tokens cached) and scores as an engine without
    prefix caching or drafts."""
    path = family_gguf(fam, gguf_dir)
    engine = spec_engine(path)
    prompt = loop_prompts(1, 40)[0]
    first = without_drafts(engine, [prompt])[0][0]  # the greedy continuation, for the oracle
    engine = spec_engine(path)  # a fresh cache: only the drafting run below fills it
    assert engine.speculator is not None
    engine.speculator.drafter = OracleDrafter([prompt], [first], wrong_at=1)
    steps = record_verifies(engine.speculator)
    assert scored(engine, [prompt])[0][0] == first
    assert any(0 < accepted < drafted for drafted, accepted in steps), steps
    again = prompt + first
    plain = spec_engine(path, speculative="off", enable_prefix_caching=False)
    engine.speculator = None
    result = engine.generate([again], SCORED)[0]
    assert result["num_cached_tokens"] > len(prompt)  # resumed from the decode snapshot it left
    got = (result["token_ids"], np.array([[v for _, v in step.top] for step in result["logprobs"]]))
    assert_same([got], scored(plain, [again]))
    assert_clean(engine)


@pytest.mark.parametrize("fam", ["qwen35", "nemotron_h"])
def test_async_decode_beside_drafting_keeps_the_tokens(fam: str, gguf_dir: Path) -> None:
    """With async decode on and drafts for one request at most: while two run, steps look ahead without
    drafts; once the shorter one ends, the other drafts (its steps synchronous). Tokens as without drafts."""
    engine = spec_engine(family_gguf(fam, gguf_dir), async_decode=True, speculative_max_batch=1)
    prompts = loop_prompts(2)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 24)]

    def run() -> dict[str, list[int]]:
        tokens: dict[str, list[int]] = {"short": [], "long": []}
        for rid, prompt, p in zip(tokens, prompts, params, strict=True):
            engine.add_request(rid, prompt, p)
        while engine.has_unfinished():
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
        return tokens

    speculator, engine.speculator = engine.speculator, None
    expected = run()
    engine.speculator = speculator
    assert speculator is not None
    steps = record_verifies(speculator)
    assert run() == expected
    assert steps and any(accepted < drafted for drafted, accepted in steps), steps
    assert_clean(engine)
