"""Step pacing (core/step_pacing.py): the per-step limit, the scheduler under it (fake limits, and a pacer
whose clock runs on test_step_cost.py's synthetic device, so every step's time is known exactly), the flag,
and the engine: pacing moves the chunks, never the tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_scheduler import expected_output, step  # sibling modules: tests/engine is on sys.path
from test_step_cost import A_MS, B_MS, C0_MS, DECODE_MS, FACTOR, fitted, true_ms

from app.cli import build_parser
from app.commands.common import engine_config
from app.engine.cache.manager import KVCacheManager
from app.engine.cache.state_cache import StateCache
from app.engine.config import EngineConfig
from app.engine.core.engine import LLMEngine
from app.engine.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from app.engine.core.step_cost import MIN_DECODE_STEPS, MIN_MIXED_STEPS, StepCostModel, StepShape, chunk_depth
from app.engine.core.step_pacing import DEFAULT_TOKENS, HEADROOM, WARMUP_TOKENS, PrefillBudget, StepPacer
from app.engine.images import ImageInput, PromptImage
from app.engine.request import Request, RequestStatus
from app.engine.sampling_params import SamplingParams


def test_without_a_decode_only_step_there_is_no_bound_to_keep() -> None:
    model = StepCostModel()
    model.observe(StepShape(8, ((0, 256),)), 0.02)  # no decode-only time to measure it against
    assert PrefillBudget(model, FACTOR, 64).tokens(0) == DEFAULT_TOKENS


def test_a_step_with_decodes_takes_no_more_than_the_largest_split_chunk() -> None:
    """With split mixed steps the pacer's max_chunk (the largest prefill graph) caps a step's chunk in every
    state of the model: no bound yet, warming up, and fitted, where the bound alone would allow more."""
    ready = fitted([StepShape(8, ((start, n),)) for start, n in [(0, 64), (64, 128), (192, 256), (448, 512),
                                                                 (960, 100), (4000, 300)]])  # fmt: skip
    unbounded = StepCostModel()
    warming = fitted([StepShape(8, ((0, 64),))])
    for model in (unbounded, warming, ready):
        assert PrefillBudget(model, 50.0, 64, max_chunk=96).tokens(0) <= 96
    assert PrefillBudget(ready, 50.0, 64).tokens(0) > 96  # what the cap holds back
    assert StepPacer(FACTOR, max_chunk=96).limit().tokens(0) == 96


def test_the_pacer_times_each_step_from_the_previous_ones_ids() -> None:
    """A step's time runs from the previous step's ids to its own; a step that samples nothing puts its
    time into the next interval, which is then not used."""
    now = [0.0]
    pacer = StepPacer(FACTOR, clock=lambda: now[0])
    decode = StepShape(8)
    for t in (0.100, 0.108, 0.116, 0.124):  # the first has nothing before it
        now[0] = t
        pacer.step_done(decode)
    assert pacer.model.decode_steps == 3 and pacer.model.decode_ms == pytest.approx(8.0)
    pacer.step_unsampled()  # e.g. a prefill chunk alone, its ids never read
    now[0] = 0.200
    pacer.step_done(decode)  # 76 ms: two steps' time and more
    assert pacer.model.decode_steps == 3
    now[0] = 0.208
    pacer.step_done(decode)
    assert pacer.model.decode_steps == 4 and pacer.model.decode_ms == pytest.approx(8.0)


def test_before_the_model_is_ready_steps_take_the_floor_and_twice_that_in_turn() -> None:
    model = fitted([])
    sizes, start = [], 0
    while not model.ready:
        sizes.append(PrefillBudget(model, FACTOR, 64).tokens(start))
        n = max(sizes[-1], 64)  # the scheduler's floor
        model.observe(StepShape(8, ((start, n),)), true_ms(StepShape(8, ((start, n),))) / 1000)
        start += n
    assert sizes == [0, WARMUP_TOKENS] * (MIN_MIXED_STEPS // 2)
    assert model.coefficients == pytest.approx((C0_MS, A_MS, B_MS), rel=0.05)  # two sizes tell c0 from a


def test_the_factor_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match=r"at least 1\.0"):
        StepPacer(0.5)
    for bad in (-1.0, 0.5, float("nan")):
        with pytest.raises(ValueError, match=r"decode_latency_factor must be 0 \(off\) or at least 1.0"):
            EngineConfig(decode_latency_factor=bad)
    assert EngineConfig(decode_latency_factor=0).decode_latency_factor == 0
    assert EngineConfig().decode_latency_factor == 0  # off until a GPU has measured it


@pytest.mark.parametrize("command", [["serve"], ["generate", "hello"]])
def test_the_flag_becomes_the_config_field(command: list[str]) -> None:
    args = build_parser().parse_args([*command, "--decode-latency-factor", "1.5"])
    assert engine_config(args).decode_latency_factor == 1.5
    assert engine_config(build_parser().parse_args([*command, "--decode-latency-factor", "0"])).decode_latency_factor == 0
    assert engine_config(build_parser().parse_args(command)).decode_latency_factor == 0  # the default: off


@pytest.mark.parametrize(("value", "says"), [("-1", "0 (off) or at least 1"), ("0.5", "0 (off) or at least 1"),
                                             ("nan", "0 (off) or at least 1"), ("fast", "a number such as 2")])  # fmt: skip
def test_bad_factors_are_refused_naming_the_flag(capsys: pytest.CaptureFixture[str], value: str, says: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--decode-latency-factor", value])
    err = capsys.readouterr().err
    assert "--decode-latency-factor" in err and says in err


# --- the scheduler under a limit ---

BS = 16


class FixedLimit:
    """A fake limit: `per_step` prefill tokens a step, whatever the position; records what was taken."""

    def __init__(self, per_step: int) -> None:
        self.left = per_step
        self.taken: list[tuple[int, int]] = []

    def tokens(self, start: int) -> int:
        return self.left

    def take(self, start: int, num_tokens: int) -> None:
        self.left = max(0, self.left - num_tokens)
        self.taken.append((start, num_tokens))


def make(budget: int = 2048, max_seqs: int = 16, max_len: int = 20000) -> Scheduler:
    kv = KVCacheManager(4096, BS)
    return Scheduler(SchedulerConfig(max_seqs, budget, max_len, BS), kv)


def req(rid: str, n: int, max_tokens: int, session: str, first: int = 0) -> Request:
    prompt = [(first + i) % 1000 for i in range(n)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens), session_id=session)


def start_decoders(sched: Scheduler, count: int = 8, max_tokens: int = 400) -> list[Request]:
    decoders = [req(f"d{i}", 100, max_tokens, f"s{i}", first=i) for i in range(count)]
    for r in decoders:
        sched.add(r)
    step(sched)  # all prompts whole, all first tokens
    assert all(r.num_output_tokens == 1 for r in decoders)
    return decoders


def prefill_plan(out: SchedulerOutput) -> list[tuple[str, int, int]]:
    return [(c.request.request_id, c.start, c.num_tokens) for c in out.chunks[out.num_decodes :]]


def test_with_decoders_prefill_chunks_are_cut_to_the_limit_on_block_boundaries() -> None:
    sched = make()
    start_decoders(sched)
    sched.add(req("long", 5000, 2, "long"))
    limit = FixedLimit(200)
    out = step(sched, limit)
    assert out.num_decodes == 8 and all(c.num_tokens == 1 for c in out.chunks[:8])
    assert prefill_plan(out) == [("long", 0, 192)]  # 200 rounded down to a block boundary
    assert limit.taken == [(0, 192)]
    assert prefill_plan(step(sched, FixedLimit(100))) == [("long", 192, 96)]  # ends at 288, a block boundary


def test_the_first_prefill_chunk_gets_the_floor_and_then_the_step_is_closed() -> None:
    sched = make()
    start_decoders(sched)
    sched.add(req("long", 5000, 2, "long"))
    sched.add(req("other", 300, 2, "other"))
    assert prefill_plan(step(sched, FixedLimit(0))) == [("long", 0, 64)]  # min_paced_chunk; "other" waits
    assert prefill_plan(step(sched, FixedLimit(0))) == [("other", 0, 64)]  # its turn (served longest ago)
    assert prefill_plan(step(sched, FixedLimit(400))) == [("long", 64, 400)]  # spent by the first chunk
    # room for both: the turns go on, "other" (served longest ago) first and whole, "long" cut to the rest
    assert prefill_plan(step(sched, FixedLimit(1000))) == [("other", 64, 236), ("long", 464, 752)]


def test_without_decoders_or_without_a_limit_the_chunks_are_todays() -> None:
    paced, plain = make(), make()
    for sched in (paced, plain):
        sched.add(req("long", 5000, 2, "long"))
    for _ in range(2):  # nothing decodes: the whole budget
        a, b = step(paced, FixedLimit(0)), step(plain)
        assert prefill_plan(a) == prefill_plan(b) == [("long", a.chunks[0].start, 2048)]
    limited, unlimited = make(), make()
    for sched in (limited, unlimited):
        start_decoders(sched)
        sched.add(req("long", 5000, 2, "long"))
    assert prefill_plan(unlimited.schedule()) == [("long", 0, 2048 - 8)]  # off: today's chunk
    assert prefill_plan(limited.schedule(None)) == [("long", 0, 2048 - 8)]


def test_a_chunk_that_starts_at_an_image_takes_the_whole_image() -> None:
    sched = make()
    start_decoders(sched)
    r = req("img", 1000, 2, "img")
    r.images = [PromptImage(0, 300, ImageInput(np.zeros((3, 4, 4), np.float32)))]
    sched.add(r)
    assert prefill_plan(sched.schedule(FixedLimit(0))) == [("img", 0, 300)]


def test_a_hybrid_models_paced_chunks_keep_their_snapshot_cuts() -> None:
    """Recurrent-state snapshot points (cache/state_cache.py `chunk_tokens`) still cut a paced prompt: every
    chunk ends on a block boundary (each saved as a snapshot), none past the interval, the prompt's last
    block boundary is one, and its tail runs with the decodes; a second request sharing the prompt resumes
    from the last snapshot."""
    interval = 160
    state = StateCache(16, 64, BS, interval)
    sched = Scheduler(SchedulerConfig(16, 2048, 20000, BS), KVCacheManager(4096, BS, state=state))
    decoders = [req(f"d{i}", 100, 400, f"s{i}", first=i) for i in range(4)]
    for r in decoders:
        sched.add(r)
    while any(r.num_output_tokens == 0 for r in decoders):  # 96 tokens, then a 4-token tail each
        step(sched)
    long = req("long", 1000, 2, "long", first=50)
    sched.add(long)
    ends = []
    while not long.num_output_tokens:
        out = step(sched, FixedLimit(300))
        assert out.num_decodes == 4
        ends += [c.start + c.num_tokens for c in out.chunks if c.request is long]
    assert ends[-1] == 1000 and ends[-2] == 992  # the last block boundary, then the tail
    assert all(end % BS == 0 for end in ends[:-1])
    assert all(0 < b - a <= min(interval, 300) for a, b in zip([0, *ends], ends, strict=False)), ends
    step(sched)  # its second token: it ends, its blocks go to the prefix cache
    assert long.status == RequestStatus.FINISHED_LENGTH
    again = req("again", 1000, 1, "again", first=50)
    sched.add(again)
    step(sched, FixedLimit(0))
    assert again.num_cached_tokens == 992


def simulate(factor: float | None, decoders: int = 8, prompt: int = 16000, c0: float = C0_MS) -> dict:
    """The interfere workload on the scheduler, timed by the synthetic cost: 8 decoders alone for 20 steps,
    then a long prompt until its first token. Returns each step's true ms while it prefilled, its steps and
    the outputs."""
    sched = make()
    clock = [0.0]
    pacer = StepPacer(factor, clock=lambda: clock[0]) if factor else None
    sessions = start_decoders(sched, decoders)

    def timed_step() -> StepShape:
        shape = StepShape.of(step(sched, pacer.limit() if pacer else None))
        clock[0] += true_ms(shape, c0) / 1000
        if pacer:
            pacer.step_done(shape)
        return shape

    for _ in range(20):
        assert not timed_step().prefill
    long = req("long", prompt, 4, "long", first=7)
    sched.add(long)
    during = []
    while long.num_output_tokens == 0:
        during.append(timed_step())
    while sched.has_unfinished():
        timed_step()
    outputs = {r.request_id: r.output_token_ids for r in [*sessions, long]}
    return {"during": during, "outputs": outputs, "long": long, "model": pacer.model if pacer else None}


def test_paced_decode_steps_stay_within_the_factor_and_the_long_prompt_completes() -> None:
    paced, plain = simulate(FACTOR), simulate(None)
    bound = FACTOR * DECODE_MS
    # off: today's chunks, each step far past the bound
    assert max(true_ms(s) for s in plain["during"]) > 5 * bound and len(plain["during"]) == 8
    steps = paced["during"]
    assert all(s.decodes == 8 for s in steps)
    warmup = steps[:MIN_MIXED_STEPS]
    assert [s.prefill_tokens for s in warmup] == [64, WARMUP_TOKENS] * (MIN_MIXED_STEPS // 2)
    for s in steps:  # every step within the bound, or at the floor (the least a step takes)
        assert true_ms(s) <= bound + 1e-9 or s.prefill_tokens == 64, (s, true_ms(s))
    assert sum(true_ms(s) > bound for s in steps) <= 2  # the floor overshoots only at the prompt's deep end
    assert paced["long"].num_output_tokens == 4 and sum(s.prefill_tokens for s in steps) == 16000
    assert len(steps) > 10 * len(plain["during"])  # the price: more steps to the first token
    assert paced["outputs"] == plain["outputs"]
    assert paced["outputs"]["long"] == expected_output(paced["long"].prompt_token_ids, 4)


# --- the engine: pacing changes the chunks, never the tokens ---

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "qwen3" / "qwen3-kquants.gguf"


def engine_run(factor: float, async_decode: bool, pacer: StepPacer | None = None) -> tuple[dict, list, LLMEngine]:
    """Three sessions decoding, then a 400-token prompt: every request's tokens, and each step's prefill
    tokens while something decoded."""
    engine = LLMEngine(EngineConfig(model=str(MODEL), device="cpu", max_model_len=512, max_num_seqs=8,
                                    max_num_batched_tokens=256, async_decode=async_decode,
                                    decode_latency_factor=factor))  # fmt: skip
    if pacer is not None:
        engine.pacer = pacer
    paced_steps: list[int] = []
    schedule = engine.scheduler.schedule

    def recording(limit=None):  # type: ignore[no-untyped-def]
        out = schedule(limit)
        if out.num_decodes:
            paced_steps.append(StepShape.of(out).prefill_tokens)
        return out

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    for i in range(3):
        engine.add_request(f"d{i}", [5 + i, 17, 29, 41] * 5, params, session_id=f"s{i}")
    for _ in range(6):  # they decode alone a while
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    engine.add_request("long", [(7 * i) % 250 + 3 for i in range(400)], SamplingParams(temperature=0.0, max_tokens=8,
                       ignore_eos=True), session_id="long")  # fmt: skip
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens, paced_steps, engine


@pytest.mark.parametrize("async_decode", [False, True])
def test_greedy_tokens_are_the_same_with_pacing_on_and_off(async_decode: bool) -> None:
    # a frozen model (its clock never moves, so it learns nothing more): 2 ms decode steps, 20 us a prefill
    # token, so factor 2 lets a step take 90 tokens (0.9 of 2 ms): 80 to a block boundary
    model = StepCostModel()
    for _ in range(MIN_DECODE_STEPS):
        model.observe(StepShape(3), 0.002)
    for i in range(MIN_MIXED_STEPS):
        n = 64 * (1 + i % 2)
        model.observe(StepShape(3, ((64 * i, n),)), 0.002 + 0.00002 * n)
    paced, paced_steps, _ = engine_run(FACTOR, async_decode, StepPacer(FACTOR, model, clock=lambda: 0.0))
    plain, plain_steps, _ = engine_run(0, async_decode)
    assert paced == plain and len(paced["long"]) == 8 and all(len(paced[f"d{i}"]) == 40 for i in range(3))
    assert max(plain_steps) > 200  # off: the prompt goes in a chunk of the budget's size
    assert max(paced_steps) == 80 and sum(paced_steps) >= 400  # on: in chunks of 80 beside the decodes


def test_the_engine_measures_its_own_steps() -> None:
    tokens, _, engine = engine_run(FACTOR, async_decode=False)
    assert len(tokens["long"]) == 8
    model = engine.pacer.model
    assert model.decode_steps >= MIN_DECODE_STEPS and model.decode_ms is not None and model.decode_ms > 0
    assert model.largest_prefill >= 64  # steps with decodes and prefill were measured too


def test_where_even_the_floor_breaks_the_bound_steps_go_factor_times_as_far_past_it() -> None:
    """A step with prefill that costs 20 ms more than a decode-only step whatever its chunk (an eager step
    beside a graph's 8 ms) cannot keep 2 x 8 ms: the floor alone would take 250 steps of ~30 ms to the first
    token. The step may then go past the bound twice as far as the cheapest step must."""
    c0 = 20.0
    paced, floor_only = simulate(FACTOR, c0=c0), simulate(1.0, c0=c0)
    extra = HEADROOM * (FACTOR - 1) * DECODE_MS  # what the bound lets a step add: 7.2 ms
    for s in paced["during"][MIN_MIXED_STEPS:]:
        start = s.prefill[0][0]
        cheapest = c0 + A_MS * 64 + B_MS * chunk_depth(start, 64)
        allowed = DECODE_MS + extra + FACTOR * (cheapest - extra)
        assert true_ms(s, c0) <= allowed + 1e-6 and s.prefill_tokens > 64, s
    assert paced["outputs"] == floor_only["outputs"]
    assert all(s.prefill_tokens == 64 for s in floor_only["during"][MIN_MIXED_STEPS:-1])  # factor 1: the floor
    ttft = sum(true_ms(s, c0) for s in paced["during"])
    assert 3 * ttft < sum(true_ms(s, c0) for s in floor_only["during"])
    assert max(true_ms(s, c0) for s in paced["during"]) < 60  # against ~100 ms for today's chunks
