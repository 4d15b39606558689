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

from pathlib import Path

import pytest
from family_parity import (
    GREEDY,
    ParityFixtures,
    batch_of_eight_equals_alone,
    engine_for,
    numba_engine_equals_numpy,
)
from gemma4_gguf import write_gguf
from model_harness import MODES

from app.engine.backend.cpu import CpuBackend
from app.engine.loader.weights import open_checkpoint
from app.engine.models.registry import build_model, model_config
from app.engine.plan.fit import shape_from_checkpoint
from app.engine.plan.memory import kv_block_bytes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gemma4"
PARITY = ParityFixtures(FIXTURES, write_gguf)
CASES = PARITY.cases
RTOL = 3e-5  # measured: <= 1.3e-5 of the scale over every case, mode and kernel set


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("gemma4-gguf"))


@pytest.mark.parametrize("kernels", ["numpy", "numba"])
@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(case: str, mode: str, fmt: str, kernels: str, gguf_dir: str) -> None:
    PARITY.check_logits(
        case, PARITY.path(case, fmt, gguf_dir), f"{fmt}, {mode}, {kernels}", mode, kernels, RTOL
    )


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("case", CASES)
def test_engine_greedy_tokens_equal_transformers(case: str, fmt: str, gguf_dir: str) -> None:
    engine = engine_for(PARITY.path(case, fmt, gguf_dir))
    [result] = engine.generate([PARITY.tokens[: PARITY.prompt_len]], GREEDY)
    assert result["token_ids"] == PARITY.reference(case, "greedy").tolist()


@pytest.mark.parametrize("case", CASES)
def test_numba_engine_generates_what_numpy_does(case: str) -> None:
    numba_engine_equals_numpy(FIXTURES / case, PARITY.tokens[: PARITY.prompt_len])


@pytest.mark.parametrize("case", CASES)
def test_a_sequence_decodes_the_same_alone_and_in_a_batch_of_eight(case: str) -> None:
    batch_of_eight_equals_alone(engine_for(FIXTURES / case, kernels="numba"))


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


@pytest.mark.parametrize("case", CASES)
def test_will_it_fit_counts_the_kv_of_the_owning_layers_as_the_engine_allocates(case: str, gguf_dir: str) -> None:
    """The KV pool holds only the layers that own a cache, each at its own heads; `paddock fit`'s memory
    model (plan/) counts the same bytes for the blocks the engine allocates, from a file's header alone."""
    path = PARITY.path(case, "gguf", gguf_dir)
    engine = engine_for(path)
    allocated = sum(
        array.nbytes for pair in {id(p): p for p in engine.runner.kv_caches if p is not None}.values() for array in pair
    )
    shape = shape_from_checkpoint(path)
    predicted = engine.plan.num_blocks * kv_block_bytes(shape, engine.plan.block_size, engine.plan.kv_dtype)
    assert abs(predicted - allocated) <= 0.05 * allocated, (predicted, allocated)
    if case == "ple":  # two of six layers read another's cache: the pool is a third smaller than six layers'
        cfg = engine.model_config
        every_layer = sum(2 * cfg.kv_heads_of(i) * cfg.head_dim_of(i) for i in range(cfg.num_layers))
        assert allocated < every_layer * 4 * engine.plan.block_size * engine.plan.num_blocks


class _WideHeadsOnly(CpuBackend):
    """The numpy backend posing as one whose attention kernels take only 64- to 512-wide heads."""

    name = "narrow"
    attention_head_dims = (64, 128, 256, 512)


def test_a_backend_without_the_head_size_refuses_at_load_naming_the_layer() -> None:
    """A backend whose attention kernels lack a layer's head size refuses to build the model (never a wrong
    answer at run time), naming the layer, its width and the way out."""
    checkpoint = open_checkpoint(FIXTURES / "dense")
    with pytest.raises(NotImplementedError) as refused:
        build_model(checkpoint, _WideHeadsOnly(), 64, model_config(checkpoint))
    message = str(refused.value)
    assert "blk.0" in message and "16 wide" in message and "--device cpu" in message
