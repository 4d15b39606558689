"""Gemma 4 (text) against transformers 5.24, on tiny random-weight checkpoints.

tests/fixtures/gemma4/ holds three Hugging Face folders made by tests/fixtures/make_gemma4_reference.py
(run in .venv-ref; this test never imports torch or transformers) and transformers' float32 logits at every
position of a 48-token sequence, plus its greedy continuation of the first 40 tokens:

- `dense`: sliding (window 8) and global layers with head sizes and KV head counts of their own, values from
  the key projection on global layers, proportional RoPE, final soft-capping;
- `ple`: per-layer input embeddings, the last two layers reading earlier layers' KV, double-wide MLPs there;
- `moe`: experts beside the dense MLP, Gemma 4's router and per-expert scales.

Each runs from the HF folder and from a GGUF written here, at test time, in llama.cpp's layout (gguf-py's
writer, tests/engine/gemma4_gguf.py), on the numpy reference and the numba CPU kernels. Both sides compute in
float32 from the same (bfloat16) weights, so the difference is float32 rounding: at most 1.3e-5 of the case's
logit scale was measured (Gemma 4's many norms amplify it over the 7e-7 of tests/engine/test_families.py),
3e-5 is allowed; a wrong head size, RoPE fraction or norm moves logits by percents. Greedy tokens equal at
every position; the first generated token's top-5 log-probs within 1e-3.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from gemma4_gguf import write_gguf
from model_harness import MODES, run_logits

from app.engine import EngineConfig, LLMEngine, SamplingParams
from app.engine.backend import cpu_backend
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import build_model, model_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gemma4"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))
TOKENS: list[int] = MANIFEST["tokens"]
PROMPT_LEN: int = MANIFEST["prompt_len"]
CASES = sorted(MANIFEST["cases"])
RTOL = 3e-5  # measured: <= 1.3e-5 of the scale over every case, mode and kernel set
MAX_POSITIONS = 64


@functools.cache
def reference(case: str, what: str) -> np.ndarray:
    with np.load(FIXTURES / "references.npz") as refs:
        return refs[f"{case}.{what}"]


@functools.cache
def gguf_path(case: str, tmp_root: str) -> Path:
    out = Path(tmp_root) / f"gemma4-{case}.gguf"
    write_gguf(FIXTURES / case, out)
    return out


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("gemma4-gguf"))


def checkpoint_path(case: str, fmt: str, gguf_dir: str) -> Path:
    return FIXTURES / case if fmt == "hf" else gguf_path(case, gguf_dir)


@functools.cache
def model(path: Path, kernels: str):
    checkpoint = open_checkpoint(path)
    backend = cpu_backend(kernels)
    return build_model(checkpoint, backend, MAX_POSITIONS, model_config(checkpoint)), backend


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(case: str, mode: str, fmt: str, kernels: str, gguf_dir: str) -> None:
    built, backend = model(checkpoint_path(case, fmt, gguf_dir), kernels)
    ours = run_logits(built, backend, TOKENS, mode)
    expected = reference(case, "logits")
    tol = RTOL * max(1.0, float(np.abs(expected).max()))
    worst = float(np.abs(ours - expected).max())
    assert worst <= tol, (
        f"{case} ({fmt}, {mode}, {kernels}): max |ours - transformers| = {worst:.3g} > {tol:.3g}"
    )
    assert (ours.argmax(-1) == expected.argmax(-1)).all(), f"{case} ({fmt}, {mode}): a greedy token differs"
    first = PROMPT_LEN - 1  # the first generated token's distribution
    top5 = np.argsort(-expected[first])[:5]
    diff = np.abs(log_softmax(ours[first])[top5] - log_softmax(expected[first])[top5]).max()
    assert diff <= 1e-3, f"{case} ({fmt}, {mode}): top-5 log-probs differ by {diff:.3g}"


def engine_for(path: Path, kernels: str = "numpy") -> LLMEngine:
    """The whole CPU engine on a fixture, prefill in chunks of 16 tokens (a 40-token prompt takes three)."""
    return LLMEngine(
        EngineConfig(
            model=str(path),
            device="cpu",
            cpu_kernels=kernels,
            max_num_seqs=8,
            max_num_batched_tokens=16,
            max_model_len=64,
        )
    )


GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("case", CASES)
def test_engine_greedy_tokens_equal_transformers(case: str, fmt: str, gguf_dir: str) -> None:
    engine = engine_for(checkpoint_path(case, fmt, gguf_dir))
    [result] = engine.generate([TOKENS[:PROMPT_LEN]], GREEDY)
    assert result["token_ids"] == reference(case, "greedy").tolist()


@pytest.mark.parametrize("case", CASES)
def test_a_sequence_decodes_the_same_alone_and_in_a_batch_of_eight(case: str) -> None:
    engine = engine_for(FIXTURES / case, kernels="numba")
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, 256, n)] for n in (5, 9, 17, 23, 31, 12, 40, 3)]
    together = [r["token_ids"] for r in engine.generate(prompts, GREEDY)]
    alone = [engine.generate([p], GREEDY)[0]["token_ids"] for p in prompts]
    assert together == alone


def test_shared_kv_layers_own_no_cache_and_the_pool_counts_only_owners() -> None:
    engine = engine_for(FIXTURES / "ple")
    cfg = engine.model_config
    caches = engine.runner.kv_caches
    assert [cfg.kv_source(i) for i in range(cfg.num_layers)] == [0, 1, 2, 3, 2, 3]
    assert caches[4] is caches[2] and caches[5] is caches[3]  # the shared layers read their sources' pairs
    owners = {id(pair) for pair in caches}
    assert len(owners) == 4
    # sliding layers: 2 KV heads of 16, global: 2 of 32 (the ple case keeps num_key_value_heads there)
    assert [c[0].shape[2:] for c in caches[:4]] == [(2, 16), (2, 32), (2, 16), (2, 32)]
