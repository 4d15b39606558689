"""Speculative decoding (app/engine/spec/): drafts verified in one step change nothing about what is
generated. Greedy tokens equal decoding without drafts (embedded Gemma 3 270M, tiny random models of
each family); sampled tokens keep the target's distribution (chi-square against the model's own
probabilities); the prefix cache and preemption never see a rejected draft."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spec_checks import assert_sampled_tokens_keep_the_distribution  # sibling: tests/engine is on sys.path

from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.sample.sampler import may_verify
from app.engine.sampling_params import SamplingParams
from app.engine.spec.ngram import NgramDrafter
from app.engine.spec.policy import SpecPolicy
from app.engine.spec.speculator import Speculator, build_speculator
from app.engine.spec.verify import accepted_tokens

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
FAMILY_MODELS = sorted(p for p in FAMILIES.glob("*/*.gguf"))
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"


def tiny_engine(path: Path, **fields: Any) -> LLMEngine:
    settings: dict[str, Any] = dict(model=str(path), device="cpu", cpu_kernels="numpy", max_model_len=256,
                                    max_num_seqs=8, max_num_batched_tokens=128, speculative="ngram",
                                    speculative_max_batch=64)  # fmt: skip
    return LLMEngine(EngineConfig(**{**settings, **fields}))


def loop_prompt(seed: int, n: int = 40) -> list[int]:
    """Random tokens repeated: the continuation of each n-gram is in the prompt."""
    part = [int(t) for t in np.random.default_rng(seed).integers(3, 256, n // 2)]
    return part + part


def without_drafts(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    speculator, engine.speculator = engine.speculator, None
    try:
        return [r["token_ids"] for r in engine.generate(prompts, params)]
    finally:
        engine.speculator = speculator


def with_drafts(engine: LLMEngine, speculator: Speculator, ids: list[int], params: SamplingParams) -> list[int]:
    """`ids`' tokens from an engine built without drafts (the shared embedded model) drafting with
    `speculator` for this request only."""
    engine.speculator = speculator
    try:
        return engine.generate([ids], params)[0]["token_ids"]
    finally:
        engine.speculator = None


# -- the pieces ---------------------------------------------------------------------------------


def test_ngram_takes_the_longest_suffix_and_its_latest_occurrence() -> None:
    drafter = NgramDrafter(min_n=1, max_n=3)
    # suffix [1, 2, 3] occurs at 0 (followed by 7, 8) and at 5 (followed by 9): the latest wins
    assert drafter.propose([1, 2, 3, 7, 8, 1, 2, 3, 9, 4, 1, 2, 3], 2) == [9, 4]
    # no 3-gram or 2-gram match: the 1-gram [5] at index 1 proposes what followed it
    assert drafter.propose([4, 5, 6, 7, 5], 3) == [6, 7, 5]
    assert drafter.propose([1, 2, 3], 4) == []  # no earlier occurrence of any suffix
    assert drafter.propose([1, 2, 1], 0) == []
    with pytest.raises(ValueError, match="n-gram sizes"):
        NgramDrafter(min_n=3, max_n=2)


def test_verification_keeps_the_agreeing_prefix_then_the_targets_token() -> None:
    assert accepted_tokens([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all accepted, then the bonus
    assert accepted_tokens([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # rejected at 1: the target's 9 replaces 6
    assert accepted_tokens([5], [4, 4]) == [4]
    with pytest.raises(ValueError, match="3 drafts need 4 samples"):
        accepted_tokens([1, 2, 3], [1, 2])


def test_policy_adapts_k_pauses_on_low_acceptance_and_stops_for_large_batches() -> None:
    from app.engine.request import Request

    policy = SpecPolicy(max_k=6, min_k=2, max_batch=4, min_acceptance=0.3, pause_steps=2)
    request = Request("r", [1, 2, 3], SamplingParams())
    assert policy.wanted(request, batch=5) == 0  # batch over the limit
    assert policy.wanted(request, batch=1) == 6
    policy.record(request, drafted=6, accepted=1)
    assert policy.wanted(request, batch=1) == 2  # one more than were accepted, at least min_k
    policy.record(request, drafted=2, accepted=2)
    assert policy.wanted(request, batch=1) == 3  # all accepted: one more
    for _ in range(4):
        policy.record(request, drafted=3, accepted=0)
    assert [policy.wanted(request, batch=1) for _ in range(3)] == [0, 0, 2]  # paused two steps, then retries


def test_config_and_builder_refuse_unknown_methods() -> None:
    with pytest.raises(ValueError, match="speculative must be off, ngram, draft or mtp"):
        EngineConfig(speculative="eagle")
    with pytest.raises(ValueError, match="speculative draft needs a draft model"):
        EngineConfig(speculative="draft")
    with pytest.raises(ValueError, match="speculative draft needs its drafter"):
        build_speculator("draft", 4, 4, may_verify)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        EngineConfig(num_draft_tokens=0)
    with pytest.raises(ValueError, match="speculative must be one of"):
        build_speculator("medusa", 4, 4, may_verify)
    assert build_speculator("off", 4, 4, may_verify) is None


# -- greedy: the same tokens --------------------------------------------------------------------


@pytest.mark.slow  # the embedded model: the tiny families' runs below check the same in the fast tier
def test_embedded_gemma_greedy_tokens_equal_without_drafts(embedded_engine: LLMEngine) -> None:
    engine = embedded_engine
    ids = engine.tokenizer.encode(CODE * 3 + "Repeat the code above exactly:\n")
    params = SamplingParams(max_tokens=40, temperature=0.0)
    expected = without_drafts(engine, [ids], params)
    speculator = build_speculator("ngram", 8, 4, may_verify)
    assert speculator is not None and with_drafts(engine, speculator, ids, params) == expected[0]
    assert speculator.drafted > 0 and speculator.accepted > 0  # drafts were verified and some kept
    engine.scheduler.check_integrity()


@pytest.mark.slow  # the embedded model: the tiny families' runs below check the same in the fast tier
def test_embedded_gemma_on_the_numba_kernels_greedy_tokens_equal_without_drafts() -> None:
    """On the numba backend a verify chunk's rows go through the few-row product (each weight row decoded
    once for all rows), a decode step's one row through gemv: other summation orders, the same tokens."""
    from app.engine.backend.cpu_fast import available

    if not available()[0]:
        pytest.skip(available()[1])
    engine = LLMEngine(EngineConfig(model="default", device="cpu", cpu_kernels="numba", max_model_len=1024,
                                    max_num_seqs=1, kv_cache_bytes=32 << 20))  # fmt: skip
    ids = engine.tokenizer.encode(CODE * 3 + "Repeat the code above exactly:\n")
    params = SamplingParams(max_tokens=40, temperature=0.0)
    expected = without_drafts(engine, [ids], params)
    speculator = build_speculator("ngram", 8, 4, may_verify)
    assert speculator is not None and with_drafts(engine, speculator, ids, params) == expected[0]
    assert speculator.accepted > 8  # some verify chunks of several rows kept their drafts
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("path", FAMILY_MODELS, ids=lambda p: p.parent.name)
def test_tiny_family_greedy_tokens_equal_without_drafts(path: Path) -> None:
    engine = tiny_engine(path)
    prompts = [loop_prompt(seed) for seed in range(3)]
    expected = without_drafts(engine, prompts, GREEDY)
    results = engine.generate(prompts, GREEDY)
    assert [r["token_ids"] for r in results] == expected
    assert engine.speculator is not None and engine.speculator.drafted > 0
    stats = engine.stats()
    assert (stats.spec_draft_tokens_total, stats.spec_accepted_tokens_total) == (
        engine.speculator.drafted, engine.speculator.accepted)  # fmt: skip
    engine.scheduler.check_integrity()


# -- the draft model (core/draft_model.py) ------------------------------------------------------

LLAMA = FAMILIES / "llama" / "llama-bf16-q8_0.gguf"
QWEN2 = FAMILIES / "qwen2" / "qwen2-q8_0.gguf"  # another random model of llama's 256-token vocabulary


@pytest.mark.slow  # the embedded model: the tiny families' runs below check the same in the fast tier
def test_embedded_gemma_greedy_tokens_equal_with_itself_as_draft_model(embedded_engine: LLMEngine) -> None:
    from app.engine.core.draft_model import DraftModelDrafter, check_same_tokenizer, draft_config

    engine = embedded_engine
    config = EngineConfig(model="default", device="cpu", speculative="draft", draft_model="default",
                          kv_cache_bytes=64 << 20)  # fmt: skip
    draft = LLMEngine(draft_config(config, engine.max_model_len))
    check_same_tokenizer(engine.tokenizer, draft.tokenizer, "target", "draft")
    ids = engine.tokenizer.encode(CODE + "Write a function that multiplies two numbers:\n")
    params = SamplingParams(max_tokens=24, temperature=0.0)
    expected = without_drafts(engine, [ids], params)
    speculator = build_speculator("draft", 6, 4, may_verify, DraftModelDrafter(draft, engine.model_config.vocab_size))
    assert speculator is not None and with_drafts(engine, speculator, ids, params) == expected[0]
    assert speculator.drafted > 0 and speculator.accepted > 0.9 * speculator.drafted  # the same model agrees
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("draft", [LLAMA, QWEN2], ids=["itself", "another_model"])
def test_draft_model_greedy_tokens_equal_without_drafts(draft: Path) -> None:
    """Drafts from the model itself are all accepted; drafts from an unrelated random model mostly
    rejected. Either way the tokens are those of decoding without drafts."""
    engine = tiny_engine(LLAMA, speculative="draft", draft_model=str(draft))
    prompts = [loop_prompt(seed) for seed in range(3)]
    expected = without_drafts(engine, prompts, GREEDY)
    assert [r["token_ids"] for r in engine.generate(prompts, GREEDY)] == expected
    speculator = engine.speculator
    assert speculator is not None and speculator.drafted > 0
    if draft == LLAMA:
        assert speculator.accepted == speculator.drafted  # greedy self-drafts: the target agrees everywhere
    else:
        assert speculator.accepted < speculator.drafted, "every draft accepted: the models are not different"
    engine.scheduler.check_integrity()


def test_preempted_requests_with_a_draft_model_resume_with_the_same_tokens() -> None:
    prompts = [loop_prompt(seed, 60) for seed in range(6)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    expected = without_drafts(tiny_engine(LLAMA), prompts, params)
    tight = tiny_engine(LLAMA, speculative="draft", draft_model=str(QWEN2), num_kv_blocks=14, block_size=16)
    results = tight.generate(prompts, params)
    assert tight.scheduler.num_preemptions > 0
    assert tight.speculator is not None and tight.speculator.drafted > 0
    assert [r["token_ids"] for r in results] == expected
    tight.scheduler.check_integrity()


def test_draft_model_proposes_its_greedy_continuation_from_cached_kv() -> None:
    """A proposal is the draft model's own greedy continuation; the next proposal, a few accepted tokens
    later, reuses the draft KV of the blocks the previous one computed."""
    engine = tiny_engine(LLAMA, speculative="draft", draft_model=str(QWEN2), block_size=4)
    drafter = engine.speculator.drafter
    draft_engine = drafter.engine
    prompt = loop_prompt(5)
    greedy = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    alone = tiny_engine(QWEN2, speculative="off", enable_prefix_caching=False)
    assert drafter.propose(prompt, 5) == alone.generate([prompt], greedy)[0]["token_ids"]
    cached = draft_engine.counters.cached_tokens
    longer = [*prompt, 7, 8, 9]
    assert drafter.propose(longer, 3) == alone.generate([longer], SamplingParams(
        max_tokens=3, temperature=0.0, ignore_eos=True))[0]["token_ids"]  # fmt: skip
    assert draft_engine.counters.cached_tokens - cached == len(prompt) // 4 * 4  # the prompt's full blocks
    assert drafter.propose(prompt, 0) == []
    assert drafter.propose(prompt, draft_engine.max_model_len) == []  # past its context: no drafts


def test_draft_ids_past_the_targets_vocabulary_end_the_draft() -> None:
    """A draft model whose embedding has more rows than the target's may propose an id the target has
    no logit for: the draft stops before it."""
    from app.engine.core.draft_model import DraftModelDrafter

    class Engine:
        max_model_len = 64

        def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[dict[str, Any]]:
            return [{"token_ids": [5, 9, 300, 7][: params.max_tokens]}]

    assert DraftModelDrafter(Engine(), target_vocab=256).propose([1, 2], 4) == [5, 9]
    assert DraftModelDrafter(Engine(), target_vocab=512).propose([1, 2], 3) == [5, 9, 300]


def test_draft_model_of_another_tokenizer_is_refused_naming_both_files() -> None:
    gemma = FAMILIES / "gemma3" / "gemma3-f16.gguf"  # a SentencePiece vocabulary of 260 tokens
    with pytest.raises(ValueError, match="vocabulary of 260 tokens") as error:
        tiny_engine(LLAMA, speculative="draft", draft_model=str(gemma))
    assert str(gemma) in str(error.value) and str(LLAMA) in str(error.value)


def test_draft_model_flags_reach_the_engine_config() -> None:
    from app.cli import build_parser
    from app.commands.common import engine_config

    for command in (["serve"], ["generate", "hello"]):
        args = build_parser().parse_args([*command, "--speculative", "draft", "--draft-model", str(QWEN2)])
        config = engine_config(args)
        assert (config.speculative, config.draft_model) == ("draft", str(QWEN2))
    with pytest.raises(ValueError, match="speculative draft needs a draft model"):
        engine_config(build_parser().parse_args(["serve", "--speculative", "draft"]))


def test_same_sized_vocabularies_with_other_tokens_are_refused() -> None:
    from app.engine.core.draft_model import check_same_tokenizer

    target, draft = tiny_engine(LLAMA, speculative="off").tokenizer, tiny_engine(QWEN2, speculative="off").tokenizer

    class Renamed:
        """llama's tokenizer with one token string changed."""

        vocab_size = draft.vocab_size

        def id_to_token(self, token_id: int) -> str:
            return "<changed>" if token_id == 255 else draft.id_to_token(token_id)

    check_same_tokenizer(target, draft, "a.gguf", "b.gguf")  # the same vocabulary: no error
    with pytest.raises(ValueError, match=r"b\.gguf and model a\.gguf have different tokenizers: token 255"):
        check_same_tokenizer(target, Renamed(), "a.gguf", "b.gguf")  # type: ignore[arg-type]


def test_draft_model_requests_report_their_drafts_and_the_draft_engine_logs_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = tiny_engine(LLAMA, speculative="draft", draft_model=str(LLAMA))
    with caplog.at_level(logging.INFO, logger="paddock.requests"):
        for i in range(2):
            engine.add_request(f"r{i}", loop_prompt(i), GREEDY)
        finals = []
        while engine.has_unfinished():
            finals += [out for out in engine.step() if out.finished]
    assert sum(out.num_draft_tokens for out in finals) == engine.speculator.drafted > 0
    assert sum(out.num_accepted_tokens for out in finals) == engine.speculator.accepted
    stats = engine.stats()
    assert (stats.spec_draft_tokens_total, stats.spec_accepted_tokens_total) == (
        engine.speculator.drafted, engine.speculator.accepted)  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if r.name == "paddock.requests"]
    assert len(lines) == 2 and all("accepted" in line and "(100%)" in line for line in lines)  # the target's only


# -- sampled: the same distribution --------------------------------------------------------------


def test_sampled_tokens_keep_the_targets_distribution() -> None:
    """The first decode verifies two drafts: one the model likes (accepted, or rejected and resampled
    without it) and, after it, one the model rarely takes (spec_checks.py)."""
    engine = tiny_engine(FAMILIES / "llama" / "llama-bf16-q8_0.gguf", max_num_seqs=64, max_num_batched_tokens=512)
    assert_sampled_tokens_keep_the_distribution(engine, loop_prompt(7, 12))


# -- the prefix cache and preemption ------------------------------------------------------------


def test_prefix_cache_never_holds_a_rejected_draft() -> None:
    """A request whose drafts were partly rejected leaves only its real tokens' KV in the prefix cache:
    its whole sequence sent again hits full blocks and continues exactly as decoding without drafts."""
    engine = tiny_engine(FAMILIES / "qwen3" / "qwen3-kquants.gguf", block_size=4)
    prompt = loop_prompt(3)
    first = engine.generate([prompt], GREEDY)[0]
    assert engine.speculator is not None
    assert engine.speculator.accepted < engine.speculator.drafted, "no draft was rejected: the test shows nothing"
    again = prompt + first["token_ids"]
    result = engine.generate([again], GREEDY)[0]
    assert result["num_cached_tokens"] == (len(again) - 1) // 4 * 4
    assert result["token_ids"] == without_drafts(tiny_engine(FAMILIES / "qwen3" / "qwen3-kquants.gguf",
                                                             enable_prefix_caching=False), [again], GREEDY)[0]
    engine.scheduler.check_integrity()


def test_preempted_speculative_requests_resume_with_the_same_tokens() -> None:
    path = FAMILIES / "llama" / "llama-bf16-q8_0.gguf"
    prompts = [loop_prompt(seed, 60) for seed in range(6)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    expected = without_drafts(tiny_engine(path), prompts, params)
    tight = tiny_engine(path, num_kv_blocks=14, block_size=16)
    results = tight.generate(prompts, params)
    assert tight.scheduler.num_preemptions > 0
    assert tight.speculator is not None and tight.speculator.drafted > 0
    assert [r["token_ids"] for r in results] == expected
    tight.scheduler.check_integrity()


# -- reporting ----------------------------------------------------------------------------------


def test_each_request_reports_drafted_and_accepted_tokens() -> None:
    """The request's outputs, its log line and the API's usage fields carry what it drafted and accepted."""
    from app.engine.core.request_log import finished_line
    from app.engine.request import Request, RequestStatus
    from app.engine.server.generation import Completed, predictions

    engine = tiny_engine(FAMILIES / "qwen3" / "qwen3-kquants.gguf")
    engine.add_request("r", loop_prompt(3), GREEDY)
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    last = outputs[-1]
    assert last.finished and last.num_draft_tokens == engine.speculator.drafted > 0
    assert last.num_accepted_tokens == engine.speculator.accepted
    done = Request("x", [1, 2], GREEDY, num_draft_tokens=10, num_accepted_tokens=4)
    done.status = RequestStatus.FINISHED_LENGTH
    assert "drafted 10, accepted 4 (40%)" in finished_line(done, 0.0)
    completed = Completed()
    completed.add(last)
    assert predictions([completed]) == {
        "accepted_prediction_tokens": last.num_accepted_tokens,
        "rejected_prediction_tokens": last.num_draft_tokens - last.num_accepted_tokens,
    }
    assert predictions([Completed()]) == {}  # nothing drafted: no fields


def test_gpu_sampler_draws_a_verify_chunks_rows_at_successive_output_positions() -> None:
    """The GPU sampler's noise is keyed by (seed, output position): a verify chunk's k+1 rows of one
    request must be positions n..n+k (the noise decoding without drafts draws there), not n each time."""
    from types import SimpleNamespace

    from app.engine.request import Request
    from app.engine.sample.gpu import GpuSampler

    seeded = Request("a", [1, 2], SamplingParams(seed=5), output_token_ids=[7, 8, 9])
    other = Request("b", [1, 2], SamplingParams(seed=6), output_token_ids=[7])
    host = SimpleNamespace(_unseeded=0, default_seed=0)
    seeds, steps = GpuSampler._seeds(host, [other, seeded, seeded, seeded])  # type: ignore[arg-type]
    assert seeds.tolist() == [6, 5, 5, 5]
    assert steps.tolist() == [1, 3, 4, 5]


def test_numba_attention_of_a_few_queries_equals_each_as_a_decode() -> None:
    """A chunk of a few queries (a verify chunk) attends on the decode kernel as that many one-token
    steps: each query's output is bit-identical to its own decode step's (what keeps greedy drafts exact)."""
    from app.engine.backend.base import AttentionMetadata
    from app.engine.backend.cpu import CpuBackend
    from app.engine.backend.cpu_fast import available
    from app.engine.backend.cpu_fast.backend import FastCpuBackend

    if not available()[0]:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(0)
    backend = FastCpuBackend()
    k_cache = rng.standard_normal((8, 4, 1, 16)).astype(np.float32)
    v_cache = rng.standard_normal((8, 4, 1, 16)).astype(np.float32)
    tables = np.array([[3, 1, 6, 2, 0], [5, 7, 4, 0, 0]], dtype=np.int32)

    def attend(q: np.ndarray, counts: list[int], lens: list[int], on: Any = backend) -> np.ndarray:
        loc = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        meta = AttentionMetadata(query_start_loc=loc, seq_lens=np.array(lens, np.int32), block_tables=tables,
                                 slot_mapping=None, positions=None, max_query_len=max(counts), max_seq_len=max(lens),
                                 block_size=4, host_query_start_loc=loc, host_seq_lens=np.array(lens, np.int32))  # fmt: skip
        return on.attention(q, k_cache, v_cache, meta, 0.25)

    q = rng.standard_normal((7, 2, 16)).astype(np.float32)  # 5 queries of a 15-token sequence, 2 of a 10-token one
    both = attend(q, [5, 2], [15, 10])
    np.testing.assert_allclose(both, attend(q, [5, 2], [15, 10], CpuBackend()), rtol=1e-5, atol=1e-6)
    for j in range(5):
        alone = attend(q[j : j + 1].repeat(2, axis=0), [1, 1], [11 + j, 9])
        assert np.array_equal(both[j], alone[0])
    assert np.array_equal(both[6], attend(q[5:7], [1, 1], [14, 10])[1])
