"""The engine's side of hybrid models (recurrent layers beside attention), on the numpy backend.

First on the hybrid families' fixtures (tests/fixtures/hybrid/, as GGUFs written at test time in
llama.cpp's layout, which carry a minimal vocabulary the engine loads): greedy tokens through
`LLMEngine` with a small prefill budget against transformers', a batch of eight against each
alone, a 2,000-token shared prefix and a 16-turn session served from state snapshots.

Then on a toy hybrid: the tiny llama fixture with its middle layer's attention replaced by a toy recurrent
mixer (a causal conv, then a slowly decaying running mean per channel: both state kinds a real recurrent
layer keeps, and every output depends on the whole history). It exercises what the engine owns
(state slots, the runner's metadata, chunked prefill continuing the state, batching, preemption,
prefix hits resuming from state snapshots) without depending on any one family's layer math; the
families' own tests run their layers through the same engine.

The reference is the model recomputed from scratch for every generated token (one chunk holding
the whole sequence, a fresh state each time), so no state carried between steps can hide in it.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hybrid_gguf import write_mamba_gguf, write_qwen_gguf  # sibling module: tests/engine is on sys.path

from app.engine import EngineConfig, SamplingParams
from app.engine.backend.recurrent_reference import causal_conv1d, sequences
from app.engine.core import engine as engine_module
from app.engine.core.engine import LLMEngine
from app.engine.core.scheduler import ScheduledChunk
from app.engine.models import decoder
from app.engine.models.config import MIXER_ATTENTION, MIXER_GATED_DELTANET, GatedDeltaNetSpec
from app.engine.request import Request

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LLAMA = FIXTURES / "families" / "llama" / "llama-bf16-q8_0.gguf"
HYBRID = FIXTURES / "hybrid"
QWEN_FAMILIES = ("qwen35", "qwen35moe", "qwen3next")
MAMBA_ARCH = {"nemotron_h": "nemotron_h", "nemotron_h_moe": "nemotron_h_moe", "granite_hybrid": "granitehybrid"}
FAMILIES = (*QWEN_FAMILIES, *MAMBA_ARCH)
CONTEXT = 9216
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
DECAY = np.float32(0.995)  # a memory of hundreds of tokens: a state resumed wrong shows for long


class ToyRecurrent:
    """Conv state `[C, K-1]` and a running state `[1, 1, hidden]` per slot; no weights."""

    def __init__(self, backend: Any, hidden: int, kernel: int) -> None:
        self.xp, self.hidden = backend.xp, hidden
        taps = np.linspace(0.2, 1.0, kernel, dtype=np.float32)
        self.weight = np.tile(taps, (hidden + 2, 1))  # conv_dim = hidden + 2 (spec below)

    def __call__(self, x: Any, meta: Any, state: tuple[Any, Any]) -> Any:
        xp = self.xp
        conv_state, running = state
        padded = xp.concatenate([x.astype(xp.float32), xp.zeros((x.shape[0], 2), xp.float32)], axis=1)
        c = causal_conv1d(xp, padded, self.weight, None, conv_state, meta)[:, : self.hidden]
        out = xp.empty_like(c)
        for start, end, slot, initial in sequences(meta):
            h = running[slot, 0, 0].copy() if initial else xp.zeros(self.hidden, xp.float32)
            for t in range(start, end):
                h = DECAY * h + (1 - DECAY) * c[t]
                out[t] = h
            running[slot, 0, 0] = h
        return xp.tanh(4 * out).astype(x.dtype)


@pytest.fixture
def toy_hybrid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The llama fixture, layer 1 made recurrent, its context widened for long prompts."""
    real_config = engine_module.model_config

    def hybrid_config(checkpoint: Any) -> Any:
        cfg = real_config(checkpoint)
        mixers = [MIXER_ATTENTION] * cfg.num_layers
        mixers[1] = MIXER_GATED_DELTANET
        spec = GatedDeltaNetSpec(num_k_heads=1, num_v_heads=1, head_k_dim=1, head_v_dim=cfg.hidden_size, conv_kernel=4)
        return cfg.with_overrides(layer_mixers=tuple(mixers), gated_deltanet=spec, context_length=CONTEXT)

    def toy_mixer(backend: Any, cfg: Any, tensors: Any, prefix: str, kind: str) -> ToyRecurrent:
        return ToyRecurrent(backend, cfg.hidden_size, cfg.gated_deltanet.conv_kernel)

    monkeypatch.setattr(engine_module, "model_config", hybrid_config)
    monkeypatch.setattr(decoder, "recurrent_mixer", toy_mixer)


def make_engine(**fields: Any) -> LLMEngine:
    settings: dict[str, Any] = dict(model=str(LLAMA), device="cpu", cpu_kernels="numpy", max_model_len=CONTEXT,
                                    max_num_seqs=8, max_num_batched_tokens=64, kv_cache_bytes=64 << 20)  # fmt: skip
    return LLMEngine(EngineConfig(**{**settings, **fields}))


def prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 256, n)]


def reference_greedy(engine: LLMEngine, tokens: list[int], n: int) -> list[int]:
    """Greedy tokens with the whole sequence recomputed from zero state for each one (on an idle
    engine without a prefix cache: it writes blocks 1.. and slot 1)."""
    assert engine.kv.prefix_cache is None and not engine.has_unfinished()
    runner, out = engine.runner, []
    seq = list(tokens)
    for i in range(n):
        ids = np.asarray(seq, np.int32)
        request = Request(f"ref-{i}", seq, GREEDY)
        request.block_ids = list(range(1, -(-len(seq) // engine.block_size) + 1))
        request.state_slot = 1  # the engine is idle: every slot is free
        meta, rows = runner.metadata([ScheduledChunk(request, 0, len(seq), True)])
        hidden = runner.model.forward(engine.backend.from_host(ids), meta, runner.kv_caches)
        logits = np.asarray(engine.backend.to_host(runner.model.logits(hidden[rows])))
        token = int(np.argmax(logits[-1]))
        out.append(token)
        seq.append(token)
    return out


_ids = itertools.count()


def run(engine: LLMEngine, tokens: list[int], params: SamplingParams = GREEDY) -> tuple[list[int], int]:
    """Greedy tokens of one request and the cached tokens it reports."""
    rid = f"r{next(_ids)}"
    engine.add_request(rid, tokens, params)
    got: list[int] = []
    cached = -1
    while engine.has_unfinished():
        for out in engine.step():
            got += out.new_token_ids
            if out.finished:
                cached = out.num_cached_tokens
    engine.scheduler.check_integrity()
    return got, cached


SCORED = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=5)
LOGPROB_TOL = 1e-3  # the bound; a state resumed wrong moves them by ~2e-2 on these fixtures


def run_scored(engine: LLMEngine, tokens: list[int]) -> tuple[list[int], np.ndarray, int]:
    """Greedy tokens, each step's top-5 log-probs and the cached tokens of one request: the
    recurrent state's share of the logits is small on random weights, so tokens alone could hide
    a state resumed from the wrong place; the log-probs cannot."""
    result = engine.generate([tokens], SCORED)[0]
    engine.scheduler.check_integrity()
    top = np.array([[value for _, value in step.top] for step in result["logprobs"]])
    return result["token_ids"], top, result["num_cached_tokens"]


def assert_same_scores(got: tuple[list[int], np.ndarray, int], expected: tuple[list[int], np.ndarray, int]) -> None:
    assert got[0] == expected[0]
    assert np.abs(got[1] - expected[1]).max() <= LOGPROB_TOL


def assert_no_state_held(engine: LLMEngine) -> None:
    state = engine.kv.state
    assert state is not None
    state.check_integrity()
    assert state.slots.num_free == state.slots.num_slots, "a state slot leaked"


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return [prompt(seed, n) for seed, n in enumerate((70, 9, 33, 130, 17, 64, 41, 100))]


@pytest.mark.usefixtures("toy_hybrid")
def test_toy_chunked_prefill_and_decode_continue_the_state(prompts: list[list[int]]) -> None:
    engine = make_engine(max_num_batched_tokens=8, enable_prefix_caching=False)
    assert engine.model_config.is_hybrid and engine.kv.state is not None
    for tokens in (prompts[0], prompts[3]):
        got, _ = run(engine, tokens)
        assert got == reference_greedy(engine, tokens, GREEDY.max_tokens)
    assert_no_state_held(engine)


@pytest.mark.usefixtures("toy_hybrid")
def test_toy_a_sequence_in_a_batch_of_eight_matches_it_alone(prompts: list[list[int]]) -> None:
    engine = make_engine(max_num_batched_tokens=48, enable_prefix_caching=False)
    alone = [run(engine, tokens)[0] for tokens in prompts]
    together = engine.generate(prompts, GREEDY)
    assert [r["token_ids"] for r in together] == alone
    assert_no_state_held(engine)


@pytest.mark.usefixtures("toy_hybrid")
def test_toy_preemption_and_abort_leave_no_slot_held(prompts: list[list[int]]) -> None:
    roomy = make_engine(enable_prefix_caching=False)
    expected = [run(roomy, tokens)[0] for tokens in prompts]
    # 11 blocks of 16 tokens for eight requests of up to 138 tokens: they preempt each other
    tight = make_engine(num_kv_blocks=12, enable_prefix_caching=False)
    results = tight.generate(prompts, GREEDY)
    assert tight.scheduler.num_preemptions > 0
    assert [r["token_ids"] for r in results] == expected
    assert_no_state_held(tight)
    for i, tokens in enumerate(prompts[:3]):
        tight.add_request(f"gone-{i}", tokens, GREEDY)
    tight.step()
    for i in range(3):
        tight.abort(f"gone-{i}")
    assert not tight.has_unfinished()
    assert_no_state_held(tight)


@pytest.mark.usefixtures("toy_hybrid")
def test_toy_a_shared_2000_token_prefix_resumes_from_a_snapshot() -> None:
    shared = prompt(100, 2000)
    first, second = shared + prompt(101, 40), shared + prompt(102, 30)
    off = make_engine(enable_prefix_caching=False)
    expected, cached_off = run(off, second)
    assert cached_off == 0
    engine = make_engine()  # the default interval: a snapshot's bytes in KV tokens, here a few blocks
    assert engine.plan.state_snapshot_interval <= 64
    run(engine, first)
    got, cached = run(engine, second)
    assert cached >= 1900, f"only {cached} of the 2,000 shared tokens were served from the cache"
    assert got == expected
    assert_no_state_held(engine)


# --- the hybrid families ---


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hybrid-engine")


def family_gguf(fam: str, folder: Path, context: int | None = None) -> Path:
    """The family's fixture as a GGUF in llama.cpp's layout; `context` widens its maximum positions
    (random weights: nothing about them depends on it) for the long-prefix tests."""
    path = folder / f"{fam}-{context}.gguf"
    if path.exists():
        return path
    source = HYBRID / fam / "hf"
    if context is not None:
        wider = folder / f"{fam}-{context}-hf"
        shutil.copytree(source, wider, dirs_exist_ok=True)
        config = json.loads((wider / "config.json").read_text(encoding="utf-8"))
        (config.get("text_config") or config)["max_position_embeddings"] = context
        (wider / "config.json").write_text(json.dumps(config), encoding="utf-8")
        source = wider
    if fam in MAMBA_ARCH:
        return write_mamba_gguf(source, MAMBA_ARCH[fam], path)
    return write_qwen_gguf(source, fam, path)


def family_engine(path: Path, **fields: Any) -> LLMEngine:
    settings: dict[str, Any] = dict(model=str(path), device="cpu", cpu_kernels="numpy", max_num_seqs=8,
                                    max_num_batched_tokens=8, block_size=8, kv_cache_bytes=64 << 20)  # fmt: skip
    return LLMEngine(EngineConfig(**{**settings, **fields}))


def manifest(fam: str) -> dict[str, Any]:
    return json.loads((HYBRID / fam / "manifest.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("async_decode", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("fam", FAMILIES)
def test_family_greedy_in_small_prefill_chunks_matches_transformers(
    fam: str, async_decode: bool, gguf_dir: Path
) -> None:
    """The prompt (longer than five 8-token steps) prefilled in chunks of the step budget, then
    greedy decode, through the engine: transformers' greedy tokens; also with async decode (each
    decode step launched from the previous one's ids before they are read back)."""
    man = manifest(fam)
    engine = family_engine(family_gguf(fam, gguf_dir), async_decode=async_decode)
    assert engine.model_config.is_hybrid and len(man["tokens"]) > 5 * 8
    params = SamplingParams(max_tokens=len(man["greedy"]), temperature=0.0, ignore_eos=True)
    assert run(engine, man["tokens"], params)[0] == man["greedy"]
    assert_no_state_held(engine)


@pytest.mark.parametrize("fam", FAMILIES)
def test_family_sequences_in_a_batch_of_eight_match_each_alone(fam: str, gguf_dir: Path) -> None:
    tokens = manifest(fam)["tokens"]
    prompts = [tokens[i : i + n] for i, n in enumerate((5, 12, 17, 23, 30, 41, 52, 66)) if i + n <= len(tokens)]
    prompts += [tokens[: 9 + 7 * i] for i in range(8 - len(prompts))]
    engine = family_engine(family_gguf(fam, gguf_dir), max_num_batched_tokens=40, enable_prefix_caching=False)
    alone = [run_scored(engine, p) for p in prompts]
    for result, single in zip(engine.generate(prompts, SCORED), alone, strict=True):
        top = np.array([[value for _, value in step.top] for step in result["logprobs"]])
        assert_same_scores((result["token_ids"], top, 0), single)
    assert_no_state_held(engine)


@pytest.mark.parametrize("fam", ["qwen35", "nemotron_h"])
def test_family_shared_2000_token_prefix_is_served_from_the_cache(fam: str, gguf_dir: Path) -> None:
    """Qwen3.5 (Gated DeltaNet) and Nemotron-H (Mamba-2): a second request sharing a 2,000-token
    prefix with the first reports >= 1,900 cached tokens and scores as on an engine with prefix
    caching off (greedy tokens and top-5 log-probs)."""
    path = family_gguf(fam, gguf_dir, context=4096)
    vocab = json.loads((HYBRID / fam / "hf" / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    rng = np.random.default_rng(7)
    shared = [int(t) for t in rng.integers(0, vocab - 1, 2000)]
    first = shared + [int(t) for t in rng.integers(0, vocab - 1, 40)]
    second = shared + [int(t) for t in rng.integers(0, vocab - 1, 30)]
    fields: dict[str, Any] = dict(max_num_batched_tokens=512, max_model_len=4096, block_size=16)
    expected = run_scored(family_engine(path, enable_prefix_caching=False, **fields), second)
    assert expected[2] == 0
    engine = family_engine(path, **fields)  # the default snapshot interval
    run(engine, first)
    got = run_scored(engine, second)
    assert got[2] >= 1900, f"only {got[2]} of the 2,000 shared tokens were served from the cache"
    assert_same_scores(got, expected)
    assert_no_state_held(engine)


@pytest.mark.slow  # ~45 s on 2 cores: sixteen prefills over a context growing to 8,500 tokens
def test_family_16_turn_session_reuses_each_earlier_turn(gguf_dir: Path) -> None:
    """Qwen3.5, a 16-turn session (`paddock bench --turns 16` at the engine's level): each turn
    re-sends the conversation so far (prompts and replies) plus ~500 new tokens. Each later turn
    reports at least 95 % of the part earlier turns sent or generated as cached (all of it but the
    last partial block); the last prompt sent again scores as on an engine without prefix caching."""
    path = family_gguf("qwen35", gguf_dir, context=10240)
    fields: dict[str, Any] = dict(max_num_batched_tokens=512, max_model_len=10240, block_size=16)
    engine = family_engine(path, **fields)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    conversation: list[int] = []
    shares = []
    for turn in range(16):
        new = [int(t) for t in np.random.default_rng(300 + turn).integers(0, 159, 480 + 7 * turn)]
        tokens = conversation + new
        got, cached = run(engine, tokens, params)
        if turn:
            assert cached >= 0.95 * len(conversation), f"turn {turn + 1}: {cached} of {len(conversation)} cached"
            shares.append(cached / len(tokens))
        conversation = tokens + got
    assert_no_state_held(engine)
    # the whole prompt's share is bounded by the ~500 new tokens: ~50 % at turn 2, ~94 % at turn 16
    assert shares[-1] > 0.9
    again = run_scored(engine, tokens)  # the last turn's prompt once more: nearly all from the cache
    assert again[2] >= 0.95 * len(tokens)
    assert_same_scores(again, run_scored(family_engine(path, enable_prefix_caching=False, **fields), tokens))


def test_family_prefix_hit_resumes_from_a_snapshot_spilled_to_host_ram(gguf_dir: Path) -> None:
    """Qwen3.5 with room for two device snapshots and a host-RAM tier: after another long request
    pushed the shared prefix's snapshots off the device, the second request resumes from host RAM."""
    path = family_gguf("qwen35", gguf_dir, context=4096)
    rng = np.random.default_rng(11)
    shared = [int(t) for t in rng.integers(0, 159, 1000)]
    first, second = shared + [5] * 20, shared + [9] * 12
    other = [int(t) for t in rng.integers(0, 159, 600)]
    fields: dict[str, Any] = dict(max_num_batched_tokens=256, max_model_len=4096, block_size=16)
    expected = run_scored(family_engine(path, enable_prefix_caching=False, **fields), second)
    per_sequence = family_engine(path, **fields).model_config.state_bytes_per_sequence
    engine = family_engine(path, state_snapshot_interval=64, state_snapshot_gb=2.5 * per_sequence / 2**30,
                           kv_host_gb=64 * per_sequence / 2**30, **fields)  # fmt: skip
    state = engine.kv.state
    assert state is not None and state.snapshots.num_rows == 2 and state.host is not None
    run(engine, first)
    run(engine, other)
    got = run_scored(engine, second)
    assert state.host_hits == 1 and got[2] >= 960
    assert_same_scores(got, expected)
    assert_no_state_held(engine)


@pytest.mark.parametrize("fam", ["qwen35", "nemotron_h"])
def test_family_preempted_requests_resume_from_their_snapshots(fam: str, gguf_dir: Path) -> None:
    """Too few KV blocks for eight requests with prefix caching on: preempted requests come back
    through prefix hits on their own snapshots, and every request scores as it does alone."""
    tokens = manifest(fam)["tokens"]
    prompts = [tokens[i:] + tokens[:i] for i in range(0, 64, 8)]
    path = family_gguf(fam, gguf_dir)
    roomy = family_engine(path, enable_prefix_caching=False, max_num_batched_tokens=64)
    alone = [run_scored(roomy, p) for p in prompts]
    tight = family_engine(path, num_kv_blocks=40, max_num_batched_tokens=64, state_snapshot_interval=16)
    results = tight.generate(prompts, SCORED)
    state = tight.kv.state
    assert state is not None
    assert tight.scheduler.num_preemptions > 0 and state.restored_tokens > 0
    for result, single in zip(results, alone, strict=True):
        top = np.array([[value for _, value in step.top] for step in result["logprobs"]])
        assert_same_scores((result["token_ids"], top, 0), single)
    assert_no_state_held(tight)
