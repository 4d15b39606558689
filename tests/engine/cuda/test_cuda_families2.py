"""Gemma 4, Laguna and Muse Glimmer on CUDA against the numpy backend (issue 36).

The models are the tiny random checkpoints the CPU tests compare with transformers (tests/fixtures/gemma4/,
laguna/, muse_glimmer/), written as GGUFs in llama.cpp's layout at test time by the CPU tests' writers:

- Gemma 4 `dense`: sliding (window 8) layers with 16-wide heads and global layers with 32-wide heads and one
  KV head of their own, values from the keys there, proportional RoPE, final soft-capping;
- Gemma 4 `ple`: per-layer input embeddings, the last two layers reading earlier layers' caches (no write);
- Gemma 4 `moe`: experts beside the dense MLP (GELU experts with per-expert output scales, on moe.cu); and a
  random Q4_K_M one of real head sizes, on prompts checked to route no token near a tie (MOE_PROMPTS says why);
- Laguna `xs`: 4 and 8 query heads per layer, a softplus output gate per head, dense and sparse MLPs (the
  sparse ones on moe.cu: sigmoid routing with its bias); its full layer rotates half of each head (partial
  RoPE, which the CUDA backend takes once branch gdn's lands), and the same model with that layer rotating
  whole heads (everything else of Laguna, independent of it);
- Muse Glimmer `base`: sliding layers and NoPE full layers, a sigmoid output gate per element.

Every prompt is longer than the window. What is asserted, as in test_cuda_engine.py: the first generated
token's top-5 log-probs within 5e-2 of numpy's, and greedy tokens equal but where numpy's top two are a
near-tie (float16 KV and prefill products may reorder those). The kernel-level checks of the head sizes
these models bring (16, 32, and Gemma 4's 512) are in test_cuda_attention.py and below.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from cuda_samples import assert_greedy_agrees, assert_top_agrees, rel_err, rope_tables

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/engine: the GGUF writers
from gemma4_gguf import write_gguf as gemma4_gguf
from laguna_gguf import write_gguf as laguna_gguf
from muse_glimmer_gguf import write_gguf as muse_glimmer_gguf

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CASES = {
    "gemma4-dense": (FIXTURES / "gemma4" / "dense", gemma4_gguf),
    "gemma4-ple": (FIXTURES / "gemma4" / "ple", gemma4_gguf),
    "gemma4-moe": (FIXTURES / "gemma4" / "moe", gemma4_gguf),
    "laguna-xs": (FIXTURES / "laguna" / "xs", laguna_gguf),
    "laguna-xs-whole-rope": (FIXTURES / "laguna" / "xs", laguna_gguf),
    "muse-glimmer": (FIXTURES / "muse_glimmer" / "base", muse_glimmer_gguf),
}
PROMPT_LENGTHS = (11, 23, 40)  # all past the window of 8; 40 takes three prefill chunks of 16
MAX_TOKENS = 8
LOGPROB_TOL = 5e-2  # test_cuda_engine.py's
# The random Q4_K_M Gemma 4s amplify rounding: numpy with its products' inputs rounded to float16 (what the
# cuBLAS path does from 3 tokens) moves their top-5 log-probs by up to 0.07 (measured); a wrong head split,
# column block or rotation moves them by whole units.
RANDOM_Q4_TOL = 0.2


def _whole_rope_copy(folder: Path, tmp: Path) -> Path:
    """`folder` with its full layers rotating the whole head (partial_rotary_factor 1): same tensors."""
    copy = tmp / folder.name
    shutil.copytree(folder, copy)
    path = copy / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 1.0
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return copy


@pytest.fixture(scope="module")
def gguf_of(tmp_path_factory):
    """case -> its GGUF, written once per module."""
    written: dict[str, str] = {}

    def get(case: str) -> str:
        if case not in written:
            tmp = tmp_path_factory.mktemp(case)
            folder, write = CASES[case]
            if case.endswith("whole-rope"):
                folder = _whole_rope_copy(folder, tmp)
            write(folder, tmp / f"{case}.gguf")
            written[case] = str(tmp / f"{case}.gguf")
        return written[case]

    return get


def _prompts(n: int = len(PROMPT_LENGTHS)) -> list[list[int]]:
    rng = np.random.default_rng(36)
    return [rng.integers(3, 256, PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)] + i).tolist() for i in range(n)]


def _generate(
    model: str, device: str, prompts: list[list[int]], one_at_a_time: bool = False, step_tokens: int = 16,
    kv_dtype: str = "auto", simt_prefill: bool = False,
) -> list[dict]:  # fmt: skip
    """Greedy tokens and top-5 log-probs; `simt_prefill`: prefill attention on attention.cu (float32 q) rather than
    the tensor-core kernel (q and the probabilities rounded to float16), no prefill graphs holding the latter."""
    from app.engine.config import EngineConfig
    from app.engine.core.engine import LLMEngine
    from app.engine.sampling_params import SamplingParams

    engine = LLMEngine(
        EngineConfig(model=model, device=device, cpu_kernels="numpy", max_model_len=128, kv_dtype=kv_dtype,
                     max_num_seqs=min(8, step_tokens), max_num_batched_tokens=step_tokens,
                     prefill_graphs=not simt_prefill)
    )  # fmt: skip
    if simt_prefill:
        engine.backend.tensor_core_prefill = False
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    if one_at_a_time:
        return [engine.generate([p], params)[0] for p in prompts]
    return engine.generate(prompts, params)


# Gemma 4 MoE's router logits spread over ~0.5 among 4 experts: every prompt routes some token within 1e-3
# of a tie, where the float16 products of batched steps (cuBLAS on the weights' float16 copies, from 3 tokens
# up) pick the other expert and the texts split beyond a near-tie (measured on numpy with its inputs rounded
# to float16). So its sequences run one at a time in steps of 2 tokens: the float32 GEMVs over the blocks,
# float32 attention; the float16 cache rounds only. The batched paths are the other cases' (and the MoE
# kernels' own tests).
SERIAL = {"gemma4-moe"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_tokens_and_first_logprobs_match_numpy(cuda, gguf_of, case: str) -> None:
    path = gguf_of(case)
    prompts = _prompts()
    reference = _generate(path, "cpu", prompts)
    serial = case in SERIAL
    ours = _generate(path, "cuda", prompts, one_at_a_time=serial, step_tokens=2 if serial else 16)
    for got, ref in zip(ours, reference, strict=True):
        assert_top_agrees(got["logprobs"][0].top, ref["logprobs"][0].top, LOGPROB_TOL, case)
        assert_greedy_agrees(got, ref, case)


def test_a_sequence_decodes_the_same_alone_and_in_a_batch_of_eight_on_cuda(cuda, gguf_of) -> None:
    """Gemma 4 dense: eight prompts of different lengths together (batched prefill chunks, then the decode
    graphs' 8-bucket) decode as each does alone, but at a near-tie of the lone run (a batch takes other
    product kernels than one sequence: float32 reordering)."""
    path = gguf_of("gemma4-dense")
    prompts = _prompts(8)
    alone = _generate(path, "cuda", prompts, one_at_a_time=True)
    together = _generate(path, "cuda", prompts)
    for got, ref in zip(together, alone, strict=True):
        assert_greedy_agrees(got, ref, "batch of 8 vs alone")


def test_nope_layers_keep_one_row_of_rope_table_on_the_gpu(cuda, gguf_of) -> None:
    """Muse Glimmer's full layers rotate by nothing: their identity table goes up as one row (the kernels
    clamp every position to it), not a row per position."""
    from app.engine.loader.weights import open_checkpoint
    from app.engine.models.registry import build_model

    model = build_model(open_checkpoint(gguf_of("muse-glimmer")), cuda, 128)
    cfg = model.config
    rows = {cfg.is_nope(i): layer.attn.spec.rope.cos.shape[0] for i, layer in enumerate(model.layers)}
    assert rows == {True: 1, False: 128}


@pytest.fixture(scope="module")
def random_gemma4(tmp_path_factory):
    """shape -> a random-weight Q4_K_M Gemma 4 of bench/make_random_gguf.py's tiny shapes, written once."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    import make_random_gguf

    written: dict[str, str] = {}

    def get(shape: str) -> str:
        if shape not in written:
            path = tmp_path_factory.mktemp(shape) / f"{shape}.gguf"
            make_random_gguf.write(shape, "q4_k_m", path)
            written[shape] = str(path)
        return written[shape]

    return get


# gemma4-tiny-moe's router picks 2 of 4 experts on logits that spread over ~0.12 (random weights), so of the ~600
# choices three prompts make, some lie within 1e-4 of a tie (those of _prompts(): down to 1.5e-5), while the
# float16 of the CUDA path (the KV cache; q and the probabilities in the tensor-core prefill) moves this model's
# router logits by up to ~3e-3 (numpy with those roundings, measured). One flipped choice moves the log-probs by
# 0.03 to 0.4: on the H100, _prompts()[2]'s positions 8 and 32 (layers 1 and 2, margins 7e-5 and 1.7e-5) took
# their other expert, and numpy with those two choices flipped gives its first step's token 542 -3.2918, the
# GPU's -3.2919 (numpy's own: -3.0058). So this shape runs prompts whose numpy run (the same float16 KV cache as
# CUDA's) routes every token of every layer at least MOE_MARGIN from a tie, checked on the reference run below,
# and its CUDA prefill runs on attention.cu (float32 q); gemma4-tiny covers the tensor-core kernels at these
# head sizes. What is left of CUDA's rounding, numpy with the decode products' x in int16 per 16 columns (as
# gemv_int.cu) and float32 reordering on every product, moves the router logits of these prompts by 2.9e-4 at
# most, flips no choice and moves the log-probs by 0.007 (measured). Each prompt is the first of seeds
# 1000 * length, 1000 * length + 1, ... whose numpy run alone keeps every choice MOE_MARGIN from a tie.
MOE_PROMPTS = ((17014, 17), (20005, 20), (24112, 24))  # (seed, length), all past the window of 16
MOE_MARGIN = 1e-3  # 3x that router-logit noise; these prompts' least margin is 1.1e-3


def moe_prompts() -> list[list[int]]:
    return [np.random.default_rng(seed).integers(3, 256, n).tolist() for seed, n in MOE_PROMPTS]


def moe_reference(path: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict], list[float]]:
    """The numpy run of MOE_PROMPTS the CUDA one is compared with (the float16 KV cache CUDA keeps), and the margin
    from a tie of every choice its router made (a token's k-th best router logit minus the next best); asserts
    that each routed token was recorded, so the margins speak for the whole run."""
    import app.engine.layers.moe as moe_layer

    margins: list[float] = []
    route = moe_layer.route

    def recording(xp, logits, spec, score_bias=None):
        ranked = -np.sort(-np.asarray(logits, np.float64), axis=-1)
        margins.extend((ranked[:, spec.num_used - 1] - ranked[:, spec.num_used]).tolist())
        return route(xp, logits, spec, score_bias)

    prompts = moe_prompts()
    with monkeypatch.context() as patch:
        patch.setattr(moe_layer, "route", recording)
        reference = _generate(path, "cpu", prompts, kv_dtype="f16")
    fed = sum(len(p) + MAX_TOKENS - 1 for p in prompts)  # every prompt token and every generated one but the last
    assert len(margins) == fed * 6, "the numpy run did not route through layers/moe.py's route"
    return reference, margins


@pytest.mark.parametrize("shape", ["gemma4-tiny", "gemma4-tiny-wide", "gemma4-tiny-moe"])
def test_gemma4_on_the_kernels_of_real_head_sizes_matches_numpy(
    cuda, random_gemma4, monkeypatch, shape: str
) -> None:
    """The fixtures' 16- and 32-wide heads run attention.cu and the op-by-op rope alone; these random Q4_K_M
    Gemma 4s have 64-wide sliding heads and 128- or 512-wide global ones (one KV head, proportional RoPE),
    so the fused rope + cache, the decode, tensor-core prefill (512 included) and fused decode-rope kernels
    run, and the Q4_K / Q6_K products; the MoE one's experts are Q4_K gate/up and Q5_0 / Q8_0 down on moe.cu
    (its prefill on attention.cu: see MOE_PROMPTS).
    Their greedy text is one token over and over (by a margin above 1), so every step's top-5 log-probs are
    compared, not only the first's."""
    path = random_gemma4(shape)
    if not shape.endswith("moe"):
        prompts = _prompts()
        reference = _generate(path, "cpu", prompts)
        ours = _generate(path, "cuda", prompts)
    else:  # see MOE_PROMPTS; one sequence at a time in steps of 2 tokens, as SERIAL above
        prompts = moe_prompts()
        reference, margins = moe_reference(path, monkeypatch)
        assert min(margins) >= MOE_MARGIN, f"a prompt routes a token {min(margins):.2e} from a tie: choose others"
        ours = _generate(path, "cuda", prompts, one_at_a_time=True, step_tokens=2, kv_dtype="f16", simt_prefill=True)
    for got, ref in zip(ours, reference, strict=True):
        assert got["token_ids"] == ref["token_ids"], shape
        for step, (mine, theirs) in enumerate(zip(got["logprobs"], ref["logprobs"], strict=True)):
            assert_top_agrees(mine.top, theirs.top, RANDOM_Q4_TOL, f"{shape}: step {step}")


@pytest.mark.parametrize(("case", "n_moe"), [("gemma4-moe", 6), ("laguna-xs-whole-rope", 3)])
def test_experts_run_on_the_grouped_kernels(cuda, gguf_of, case: str, n_moe: int) -> None:
    """Gemma 4's GELU experts beside the MLP with their per-expert output scales, and Laguna's sparse layers
    (sigmoid scores chosen with a bias, weighed times a scale), run as one `backend.moe` call per layer
    (moe.cu: no host sync, so the decode steps can be CUDA graphs); the logits check is above."""
    from app.engine.loader.weights import open_checkpoint
    from app.engine.models.registry import build_model

    model = build_model(open_checkpoint(gguf_of(case)), cuda, 128)
    experts = [layer.moe or getattr(layer.experts_beside, "experts", None) for layer in model.layers]
    assert sum(e is not None for e in experts) == n_moe
    assert all(e.grouped is not None for e in experts if e is not None)
    assert not model.syncs_host


@pytest.mark.parametrize("head_dim", [16, 512])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_rope_and_cache_of_narrow_and_wide_heads_match_numpy(cuda, cpu, rng, head_dim: int, qk_norm: bool) -> None:
    """rope_and_cache at the head sizes rope_cache.cu newly takes (512: 256 threads) or leaves to the
    op-by-op path (16): q and the cache rows written."""
    from app.engine.backend.base import RopeTable

    n_heads, n_kv, n_tok, block = 8, 2, 5, 16
    cos, sin = rope_tables(head_dim, 256)
    norms = [rng.uniform(0.5, 1.5, head_dim).astype(np.float32) for _ in range(2)] if qk_norm else [None, None]
    qkv = rng.standard_normal((n_tok, (n_heads + 2 * n_kv) * head_dim)).astype(np.float32)
    positions = np.array([0, 3, 7, 100, 255], np.int32)
    slots = np.array([1, 5, 17, 30, 2], np.int32)
    caches_c = cpu.alloc_kv_cache(4, block, n_kv, head_dim)
    caches_g = cuda.alloc_kv_cache(4, block, n_kv, head_dim)
    want = cpu.rope_and_cache(qkv, n_heads, n_kv, head_dim, *norms, 1e-6, positions, RopeTable(cos, sin), False,
                              *caches_c, slots)  # fmt: skip
    got = cuda.rope_and_cache(
        cuda.from_host(qkv), n_heads, n_kv, head_dim, *[None if w is None else cuda.from_host(w) for w in norms],
        1e-6, cuda.from_host(positions), cuda.rope_table(cos, sin), False, *caches_g, cuda.from_host(slots),
    )  # fmt: skip
    assert rel_err(cuda.to_host(got), want) < 1e-5
    for got_cache, want_cache in zip(caches_g, caches_c, strict=True):
        rows = cuda.to_host(got_cache).reshape(-1, n_kv, head_dim)[slots].astype(np.float32)
        np.testing.assert_allclose(rows, want_cache.reshape(-1, n_kv, head_dim)[slots], rtol=2e-3, atol=2e-3)
